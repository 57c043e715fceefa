"""The GPU acceptance suite runs only where TensorFlow sees a GPU.

Run it with `pytest -m gpu tests/gpu` (README: "On a GPU"). Elsewhere every
test here is skipped, without touching a device.
"""

import pytest
import tensorflow as tf

GPUS = tf.config.list_physical_devices("GPU")  # lists; does not initialise


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    if not GPUS:
        pytest.skip("no GPU visible to TensorFlow (tests/gpu is for GPU machines)")
