"""The Keras a lane means to test: README's keras-nightly lane sets
KERASCALE_EXPECT_KERAS, and a run on any other Keras (the nightly not first
on PYTHONPATH, in this process or a child's folder) stops at once rather
than passing on the Keras the other lanes test already."""

import os


def check() -> None:
    wanted = os.environ.get("KERASCALE_EXPECT_KERAS")
    if not wanted:
        return
    import keras

    if keras.__version__ != wanted:
        raise RuntimeError(
            f"This lane tests Keras {wanted} (KERASCALE_EXPECT_KERAS), but "
            f"Keras {keras.__version__} was imported from {keras.__file__}."
        )
