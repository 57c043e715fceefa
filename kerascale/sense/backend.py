"""Which Keras backend runs the model: the one seam every backend choice reads.

As in Keras, the backend is the user's choice (`KERAS_BACKEND`, or
`~/.keras/keras.json`); kerascale plans for it and never switches it. It
supports TensorFlow (`tf.distribute`) and JAX (`keras.distribution`); on any
other backend (torch, numpy, openvino) `kerascale.fit` trains as `model.fit`
would, with one warning (`kerascale.fit`'s door).

Tests replace `name` to stand in for a backend that is not installed.
"""

from __future__ import annotations

import keras

SUPPORTED = ("tensorflow", "jax")


def name() -> str:
    """The Keras backend of this process: "tensorflow", "jax", "torch", ..."""
    return keras.backend.backend()


def supported(backend: str | None = None) -> bool:
    """Whether kerascale plans for `backend` (default: this process's)."""
    return (backend or name()) in SUPPORTED


def unsupported_warning(backend: str, skipped: list[str]) -> str:
    """The one warning `fit` gives on a backend it does not plan for."""
    what = f"; the options it ignored: {', '.join(skipped)}" if skipped else ""
    return (
        f"kerascale plans for the TensorFlow and JAX backends, and Keras runs on "
        f"{backend!r} here: trained with plain model.fit (Keras's own batch, "
        f"precision and devices){what}. To get kerascale's choices, run with "
        "KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow."
    )


def version(backend: str | None = None) -> str:
    """The installed version of `backend`'s library (default: this
    process's), or "" when it cannot be read; nothing is imported."""
    import importlib.metadata

    package = backend or name()
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""
