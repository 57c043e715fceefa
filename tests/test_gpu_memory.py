"""GPU memory through the seams (no GPU runs TensorFlow here): a fake GPU box
(the hardware seam), a fake NVML, TensorFlow's per-device memory stats stood
in for, and a deterministic threshold above which a training step raises
ResourceExhaustedError, as a GPU's allocator does. That the process goes on
after TensorFlow's real allocator refuses is tested on its own (each refusal
costs 10 s: the allocator waits that long for memory to be freed).

What only a real GPU can check is in tests/gpu (README: "On a GPU").
"""

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import dense_model, gpu_box, toy_data
from oom_seam import OutOfMemoryAbove
from test_batch_search import spec_for
from test_hardware import fake_nvml

import kerascale
from kerascale.measure import child, probe, probe_memory
from kerascale.measure.request import SearchOptions
from kerascale.sense import gpu_memory, hardware

GiB = 1 << 30
MiB = 1 << 20
TOTAL = 16 * GiB


def model_that_runs_out_above(threshold):
    inputs = keras.Input((4,))
    h = OutOfMemoryAbove(threshold)(inputs)
    out = keras.layers.Dense(2, activation="softmax")(h)
    model = keras.Model(inputs, out)
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


@pytest.fixture
def fake_gpu(monkeypatch):
    """One 16 GiB A100 that this process's allocator already holds 90% of:
    NVML says 1.6 GiB free; TensorFlow's stats say 1 GiB in use by tensors.
    Children must not be started (a test that wants them replaces this)."""
    monkeypatch.setattr(
        hardware, "detect_hardware", lambda nvml=True: gpu_box(1, memory=TOTAL)
    )
    device = {"name": "NVIDIA A100", "uuid": "GPU-a", "mem": TOTAL, "cc": (8, 0)}
    device["free"] = TOTAL // 10
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([device]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    real_info = tf.config.experimental.get_memory_info
    real_reset = tf.config.experimental.reset_memory_stats

    def info(d):
        if d.startswith("GPU"):
            return {"current": GiB, "peak": GiB + 64 * MiB}
        return real_info(d)

    def reset(d):
        if not d.startswith("GPU"):
            real_reset(d)

    monkeypatch.setattr(tf.config.experimental, "get_memory_info", info)
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", reset)

    def no_children(*a, **k):
        raise AssertionError("a child process was started on a GPU")

    monkeypatch.setattr(child, "IsolatedProber", no_children)
    real_train = probe.train_probe

    def train(model, spec, batch):
        # The real training step, refused above the threshold as a GPU's
        # allocator refuses: before any tensor of the batch exists.
        if batch > device["threshold"]:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"OOM when allocating tensor with shape[{batch},4]"
            )
        return real_train(model, spec, batch)

    monkeypatch.setattr(probe, "train_probe", train)
    device["threshold"] = 10**9
    return device


def test_a_gpu_search_probes_in_this_process_until_its_allocator_refuses(fake_gpu):
    """The probes run here, where the allocator training will use lives;
    memory running out is a ResourceExhaustedError the process survives. The
    found batch is the threshold's, less the margin, and trains afterwards."""
    fake_gpu["threshold"] = 300
    x, y = toy_data(2048)
    model = dense_model()
    result = kerascale.find_batch_size(
        model, x, y, strategy="default", precision="float32", verbose=0
    )
    assert 0.9 * 300 <= result.batch_size <= 300
    refused = [p for p in result.probes if p.outcome == "oom"]
    assert refused and all(p.batch > 300 for p in refused)
    assert all("ResourceExhaustedError" in p.message for p in refused)
    assert result.reasons["isolate"].code == "isolate.gpu"
    measured = result.reasons["memory"].details["measured"]
    assert measured == "GPU memory of this process's TensorFlow allocator"
    # Never the total: the device less TensorFlow's reserve for cc 8 (1.5 GiB).
    assert result.limit_bytes == TOTAL - 1536 * MiB
    assert result.reasons["limit"].code == "limit.gpu_here"
    assert "1.00 GiB" in result.reasons["limit"]  # what this process holds

    history = kerascale.fit(
        model,
        x,
        y,
        strategy="default",
        precision="float32",
        epochs=1,
        verbose=0,
    )
    plan = history.plan
    # fit keeps 8 updates an epoch (a cap of 256), and found that fits.
    assert plan.global_batch_size == 256
    assert "TensorFlow allocator" in plan.reasons["global_batch_size"]
    assert int(model.optimizer.iterations) == 2048 // 256


def test_a_child_on_a_gpu_would_get_only_what_is_free(fake_gpu):
    """isolate=True: the limit is what a new process's allocator gets (the
    free 10% less TensorFlow's reserve), and the reason says who holds the
    rest; in this process, the device less other processes and the reserve."""
    fake_gpu["processes"] = [(1, 2 * GiB)]  # another process holds 2 GiB
    plan = kerascale.plan(
        dense_model(),
        *toy_data(64),
        strategy="default",
        precision="float32",
        batch_size=32,
        verbose=0,
    )
    hw = hardware.detect_hardware()
    options = SearchOptions.validate()
    in_child, here = probe_memory.memories(hw, plan, options)
    assert in_child.predict == TOTAL // 10 - 225 * MiB  # under 2 GiB free
    assert "Most of the GPU is held" in in_child.why
    assert in_child.enforce is None  # the child's own allocator decides
    assert here.predict == TOTAL - 2 * GiB - 1536 * MiB
    assert here.enforce is None
    _, given = probe_memory.memories(
        hw, plan, SearchOptions.validate(memory_limit="6GiB")
    )
    assert (given.enforce, given.predict) == (6 * GiB, 6 * GiB)


def test_without_nvml_a_gpu_search_probes_alone(fake_gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    fake_gpu["threshold"] = 40
    x, y = toy_data(256)
    result = kerascale.find_batch_size(
        dense_model(),
        x,
        y,
        strategy="default",
        precision="float32",
        verbose=0,
    )
    # The search to the allocator's refusal is the test above's, at 300.
    assert 0.9 * 40 <= result.batch_size <= 40
    assert result.limit_bytes is None
    assert result.reasons["limit"].code == "limit.gpu_unknown"


def test_when_even_one_sample_does_not_fit_the_error_names_the_gpu_memory(fake_gpu):
    fake_gpu["threshold"] = 0
    with pytest.raises(kerascale.BatchSizeSearchError) as e:
        kerascale.find_batch_size(
            dense_model(),
            *toy_data(64),
            strategy="default",
            precision="float32",
            verbose=0,
        )
    assert e.value.out_of_memory
    assert "Even a batch of 1" in str(e.value)
    assert "The GPU memory the probes had: about 14.50 GiB" in str(e.value)


@pytest.mark.parametrize(
    "free, cc, reserve",
    [
        (1 * GiB, (8, 0), 225 * MiB),
        (8 * GiB, (6, 1), 500 * MiB),
        (8 * GiB, (7, 5), 1050 * MiB),
        (8 * GiB, (8, 9), 1536 * MiB),
        (8 * GiB, (9, 0), 1800 * MiB),
    ],
)
def test_tensorflows_reserve(free, cc, reserve, monkeypatch):
    """MinSystemMemory in TensorFlow's gpu_device.cc, and its override."""
    monkeypatch.delenv("TF_DEVICE_MIN_SYS_MEMORY_IN_MB", raising=False)
    assert gpu_memory.min_system_memory(free, cc[0]) == reserve
    monkeypatch.setenv("TF_DEVICE_MIN_SYS_MEMORY_IN_MB", "700")
    assert gpu_memory.min_system_memory(free, cc[0]) == 700 * MiB


def test_the_process_goes_on_after_its_allocator_refused():
    """What the in-process search rests on, with TensorFlow's real allocator:
    a probe that runs out of memory is an "oom" outcome, not a crash, and
    the same model then trains at a batch that fits."""
    model = model_that_runs_out_above(16)
    x, y = toy_data(64)
    prober = probe.InProcessProber(model, spec_for(x, y))
    refused = prober(64)
    assert refused.outcome == "oom"
    assert refused.message.startswith("ResourceExhaustedError")
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    after = model.get_weights()
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
