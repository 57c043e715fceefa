"""The JAX backend's tests: run in a virtual environment with keras and jax
and no TensorFlow (README, "Development"), on 1 and on 2 forced host devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=2`).
"""

import gc
import os

import xla_flags

os.environ["KERAS_BACKEND"] = "jax"
# The hardware seam: the forced CPU devices stand in for GPUs, so "auto" splits
# over them as it would over accelerators (children inherit it). Without it
# kerascale trains on one of them (test_jax_fit's test of the CPU default).
os.environ["KERASCALE_CPU_DEVICES_STAND_IN"] = "1"
# Before JAX starts: tests_common/xla_flags.py says why.
os.environ["XLA_FLAGS"] = xla_flags.patient()

import lazy
import numpy as np
import pytest

# Imported on first use: xdist's controller imports this file and runs no
# test (tests_common/lazy.py).
jax = lazy.module("jax")
keras = lazy.module("keras")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASCALE_CACHE_DIR", str(tmp_path / "kerascale-cache"))


@pytest.fixture(autouse=True)
def _fresh_keras():
    """A clean Keras session, a fixed seed, float32 and no distribution."""
    keras.backend.clear_session()
    gc.freeze()  # what outlived the last test: the root conftest says why
    keras.config.set_dtype_policy("float32")
    keras.distribution.set_distribution(None)
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.distribution.set_distribution(None)


def devices() -> int:
    return len(jax.local_devices())


def pytest_collection_modifyitems(config, items):
    """The suite runs on 1 and on 2 devices (noxfile.py's jax and jax_2dev
    lanes); a test marked `once` tests nothing the device count changes, so
    it runs on 1 only."""
    if devices() == 1:
        return
    skip = pytest.mark.skip(reason="marked once: it runs in the 1-device suite")
    for item in items:
        if item.get_closest_marker("once"):
            item.add_marker(skip)


def dense_model(inputs=4, outputs=2, optimizer="sgd", seed=0, **compile_kwargs):
    """A tiny functional model, compiled, float32, built outside any
    distribution; the same weights for the same seed."""
    keras.utils.set_random_seed(seed)
    x_in = keras.Input((inputs,))
    h = keras.layers.Dense(8, activation="relu", name="hidden")(x_in)
    out = keras.layers.Dense(outputs, activation="softmax", name="out")(h)
    model = keras.Model(x_in, out)
    compile_kwargs.setdefault("loss", "sparse_categorical_crossentropy")
    model.compile(optimizer=optimizer, **compile_kwargs)
    return model


def toy_data(n=64, inputs=4, classes=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32") % classes
    return x, y


def pytest_sessionstart(session):
    import keras_lane

    if not lazy.in_controller(session.config):  # its workers check
        assert keras.backend.backend() == "jax", "tests_jax must run on JAX"
        keras_lane.check()
