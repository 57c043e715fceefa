import gc
import os

import xla_flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# For JAX here and in the children: tests_common/xla_flags.py says why.
os.environ["XLA_FLAGS"] = xla_flags.patient()

import keras
import numpy as np
import pytest

from kerascale.sense.hardware import CPUInfo, GPUInfo, Hardware


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

    from kerascale.measure import decide
    from kerascale.sense import hardware

    real = hardware.detect_hardware

    def detect(*, nvml=True):
        found = real(nvml=nvml)
        cpu = dataclasses.replace(found.cpu, bf16=True, bf16_flags=("amx_bf16",))
        return dataclasses.replace(found, cpu=cpu)

    monkeypatch.setattr(hardware, "detect_hardware", detect)
    # bf16 as if the run repaid its start: these runs are a second long.
    monkeypatch.setattr(decide, "_too_short_for_bf16", lambda *a: "")


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


CPU = CPUInfo(cores=8, model="Test CPU", bf16=False)
CPU_BF16 = CPUInfo(cores=8, model="Test CPU", bf16=True, bf16_flags=("amx_bf16",))


def gpu_box(n=1, name="NVIDIA A100", cc=(8, 0), memory=40 << 30):
    return Hardware(cpu=CPU, gpus=tuple(GPUInfo(i, name, memory, cc) for i in range(n)))


# Tests that time something (trials, the diagnosis's verdicts, a time budget):
# README runs them alone (`-m serial`). Tests that start real clusters or wait
# on a lease (heartbeats, a worker's timeout) run two at a time among
# themselves (`-m cluster`: their processes wait more than they compute, 55%
# of 2 cores alone), never beside the rest. Then the rest run two at a time
# (`-n 2`). A module maps to its tests' names, or to None where all of them
# are.
SERIAL = {
    "test_budget.py": {
        "test_a_short_fit_trains_at_kerass_default_without_searching",
        "test_the_search_runs_when_the_run_pays_for_it",
        "test_a_bound_the_user_gave_is_always_searched_under",
        "test_a_cached_search_is_used_whatever_the_run",
        "test_the_ladder_runs_in_the_children_the_cost_counts",
    },
    "test_diagnosis.py": {
        "test_input_bound_workload",
        "test_compute_bound_workload",
        "test_cli_diagnose_prints_json",
        "test_a_decode_bound_pipeline_is_told_to_materialize_with_the_decode_share",
    },
    "test_monitoring.py": {
        "test_time_budget_real_short_budget_stops_in_time",
        "test_fit_installs_monitoring_and_resumes_after_its_time_budget",
    },
    "test_trials.py": {
        "test_real_trials_time_copies_and_leave_the_model_alone",
        "test_fit_on_a_bf16_cpu_measures_and_says_so",
    },
}
CLUSTER = {
    "test_compat.py": {"test_two_workers_train_like_one_process"},
    "test_lease.py": None,
    "test_multiworker.py": None,
}


def _listed(item, table) -> bool:
    names = table.get(item.path.name, ())
    return names is None or item.originalname in names


def pytest_collection_modifyitems(config, items):
    from longest import longest_first  # a child importing conftest lacks it

    longest_first(items)  # handed out first (longest.py)
    for item in items:
        if _listed(item, SERIAL):
            item.add_marker(pytest.mark.serial)
        elif _listed(item, CLUSTER):
            item.add_marker(pytest.mark.cluster)


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

    keras_lane.check()
