import functools
import gc
import os

import xla_flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# For JAX here and in the children: tests_common/xla_flags.py says why.
os.environ["XLA_FLAGS"] = xla_flags.patient()

import lazy
import numpy as np
import pytest

# Imported on first use: xdist's controller imports this file and runs no
# test (tests_common/lazy.py).
keras = lazy.module("keras")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Batch-search results go to a per-test cache, never the user's."""
    monkeypatch.setenv("KERASCALE_CACHE_DIR", str(tmp_path / "kerascale-cache"))


@pytest.fixture(autouse=True)
def _short_trials(monkeypatch):
    """Trials time windows of 0.05 s instead of 0.6 s (and warm up for 0.1 s):
    the same code, with noisier figures, so that the suite stays short. Their
    timing is benchmarked in benchmarks/end_to_end.py."""
    from kerascale.measure import trial_bench

    monkeypatch.setattr(trial_bench, "WINDOW_SECONDS", 0.05)
    monkeypatch.setattr(trial_bench, "WARMUP_SECONDS", 0.1)


@pytest.fixture
def no_budget(monkeypatch):
    """No budget: the batch search's ladder and the trials run whatever the
    run's length (the suite's runs are a second long, too short to repay
    what they cost)."""
    from kerascale.measure import budget

    monkeypatch.setattr(budget, "REPAY", 0.0)


@pytest.fixture
def bf16_cpu(monkeypatch):
    """This machine, as a CPU with native bf16 (the hardware seam): for tests
    of what kerascale does once it has chosen or been given mixed_bfloat16,
    which must not depend on the CPU CI happens to run on (TensorFlow runs
    bf16 on any CPU, emulated where the CPU lacks the instructions)."""
    import dataclasses

    from kerascale.plan import precision as precision_rules
    from kerascale.sense import hardware

    real = hardware.detect_hardware

    def detect(*, nvml=True):
        found = real(nvml=nvml)
        cpu = dataclasses.replace(found.cpu, bf16=True, bf16_flags=("amx_bf16",))
        return dataclasses.replace(found, cpu=cpu)

    monkeypatch.setattr(hardware, "detect_hardware", detect)
    # bf16 chosen as the trials would where they time it faster (the rule
    # leaves it to them on a CPU: `precision.trial_candidate`).
    monkeypatch.setattr(precision_rules, "trial_candidate", lambda hw: "")


@pytest.fixture(autouse=True)
def _fresh_keras():
    """A clean Keras session, a fixed seed and the float32 policy per test."""
    keras.backend.clear_session()
    gc.freeze()  # what outlived the last test: the root conftest says why
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


def dense_model(inputs=4, outputs=2, optimizer="sgd", **compile_kwargs):
    """A tiny functional model, compiled, float32, outside any scope."""
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
    y = (x[:, 0] > 0).astype("int64") % classes
    return x, y


@functools.cache
def fake_cpus():
    """{"CPU", "CPU_BF16"}: fake CPUs, made on first use (kerascale's import
    waits for a test)."""
    from kerascale.sense.hardware import CPUInfo

    return {
        "CPU": CPUInfo(cores=8, model="Test CPU", bf16=False),
        "CPU_BF16": CPUInfo(
            cores=8, model="Test CPU", bf16=True, bf16_flags=("amx_bf16",)
        ),
    }


def __getattr__(name):
    """`from conftest import CPU` (or CPU_BF16), PEP 562."""
    if name in ("CPU", "CPU_BF16"):  # pytest looks for its hooks here too
        return fake_cpus()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gpu_box(n=1, name="NVIDIA A100", cc=(8, 0), memory=40 << 30):
    from kerascale.sense.hardware import GPUInfo, Hardware

    gpus = tuple(GPUInfo(i, name, memory, cc) for i in range(n))
    return Hardware(cpu=fake_cpus()["CPU"], gpus=gpus)


def keras_hub_or_skip():
    """keras-hub, or the test skipped with why: a keras-hub release that
    cannot import on this Keras (keras-hub 0.32.0 on Keras 3.16 imports
    `keras.src.backend.get_keras_mask`, which 3.16 moved) is keras-hub's
    break, not kerascale's."""
    from importlib import metadata

    try:
        import keras_hub
    except ModuleNotFoundError:
        pytest.skip("keras-hub is not installed", allow_module_level=True)
    except ImportError as e:
        pytest.skip(
            f"keras-hub {metadata.version('keras-hub')} cannot import on Keras "
            f"{keras.__version__}: {e}",
            allow_module_level=True,
        )
    return keras_hub


def pytest_sessionstart(session):
    import keras_lane

    if not lazy.in_controller(session.config):  # its workers check
        keras_lane.check()
