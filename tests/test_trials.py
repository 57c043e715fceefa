"""Trials: the CPU decisions a rule can get wrong, measured before committing."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CPU, CPU_BF16, dense_model, gpu_box, toy_data

import kerascale
from kerascale.measure import trials
from kerascale.plan.options import Options
from kerascale.sense import hardware
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

BF16_HOST = Hardware(cpu=CPU_BF16)


def mapped(n=256):
    x, y = toy_data(n)
    return tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b))


class FakePlan:
    precision = "mixed_bfloat16"
    micro_batch_size = 32
    step_batch_size = 32
    replicas = 1
    strategy = "default"


def test_trials_run_only_on_a_cpu_for_choices_left_open():
    model = ModelFacts(policy="float32")
    auto = Options.validate()
    assert trials.possible(auto, BF16_HOST, model)
    assert not trials.possible(auto, gpu_box(1), model)
    # A model that cannot be copied is borrowed (trained, then put back)...
    uncopyable = ModelFacts(rebuildable=False, why_not_rebuildable="x")
    assert trials.possible(auto, BF16_HOST, uncopyable)
    # ...unless what training changes is not all in its variables.
    frozen = ModelFacts(
        rebuildable=False,
        why_not_rebuildable="x",
        borrowable=False,
        why_not_borrowable="it trains with its own train_step (GAN)",
    )
    assert not trials.possible(auto, BF16_HOST, frozen)

    ds, data = mapped(), DataFacts(kind="dataset")
    assert trials.wanted(auto, FakePlan, data, ds) == (True, True)
    pinned = Options.validate(precision="mixed_bfloat16", optimize_data=True)
    assert trials.wanted(pinned, FakePlan, data, ds) == (False, False)
    plain = tf.data.Dataset.from_tensor_slices(toy_data(8))  # no map to parallelise
    assert trials.wanted(auto, FakePlan, data, plain) == (False, True)


@pytest.fixture
def timed(monkeypatch):
    """Deterministic speeds through the measuring seam; records each trial."""
    calls = []

    def speed(batch, policy, pipe):
        base = {32: 100, 64: 180, 128: 200, 256: 203}[batch]
        return base * (1.5 if policy != "float32" else 1.0) * (0.9 if pipe else 1.0)

    def fake(model, x, y, data, plan, batch, policy, optimize):
        calls.append((batch, policy, optimize))
        return trials.Trial(batch, policy, optimize, speed(batch, policy, optimize))

    monkeypatch.setattr(trials, "_measure", fake)
    return calls


def run_all():
    """Every trial: the four batches, the pipeline, the precision."""
    return trials.run(
        dense_model(),
        mapped(),
        None,
        DataFacts(kind="dataset"),
        FakePlan,
        BF16_HOST,
        try_pipeline=True,
        try_precision=True,
        batches=(32, 64, 128, 256),
        verbose=0,
    )


def test_coordinate_trials_pick_batch_then_pipeline_then_precision(timed):
    r = run_all()
    # 128 is within 3% of 256's speed: the smaller batch wins; the pipeline as
    # given beats the parallel one here; bf16 beats float32.
    assert (r.batch, r.optimize_data, r.precision) == (128, False, "mixed_bfloat16")
    assert timed == [
        (32, "mixed_bfloat16", True),
        (64, "mixed_bfloat16", True),
        (128, "mixed_bfloat16", True),
        (256, "mixed_bfloat16", True),
        (128, "mixed_bfloat16", True),  # the two fastest, timed again
        (256, "mixed_bfloat16", True),
        (128, "mixed_bfloat16", False),
        (128, "float32", False),
    ]
    assert "32: 135, 64: 243, 128: 270 & 270, 256: 274 & 274" in r.why("batch")
    assert "128, float32, pipeline as given: 200 samples/s" in r.why("precision")
    # Cached: nothing is measured again.
    timed.clear()
    again = run_all()
    assert timed == [] and again.cached
    assert (again.batch, again.optimize_data, again.precision) == (
        128,
        False,
        "mixed_bfloat16",
    )


def test_a_real_trial_times_a_copy_and_leaves_the_model_alone():
    model = dense_model()
    before = [w.copy() for w in model.get_weights()]
    x, y = toy_data(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    plan = kerascale.plan(model, ds, batch_size=32, precision="float32", verbose=0)
    t = trials._measure(
        model, ds, None, DataFacts(kind="dataset"), plan, 32, "mixed_bfloat16", True
    )
    assert t.samples_per_s > 0 and t.batch == 32
    after = model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert keras.config.dtype_policy().name == "float32"
    assert not model.optimizer.built or int(model.optimizer.iterations) == 0


def test_fit_on_a_bf16_cpu_measures_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    model = dense_model()
    history = kerascale.fit(model, mapped(), batch_size=32, epochs=1, verbose=0)
    plan = history.plan
    assert plan.reasons["precision"].startswith("measured fastest here (trials:")
    assert "measured fastest here" in plan.reasons["data_changes"]
    assert plan.precision in ("float32", "mixed_bfloat16")
    assert capsys.readouterr().out == ""  # verbose=0: the trials print nothing
    # A second plan reads the cache.
    again = kerascale.plan(model, mapped(), batch_size=32, verbose=0)
    assert "cached trials" in again.reasons["precision"]
    assert again.precision == plan.precision


def test_no_trials_for_pinned_choices_or_accelerators(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("no trial expected")

    monkeypatch.setattr(trials, "_measure", boom)
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    p = kerascale.plan(
        dense_model(),
        mapped(),
        batch_size=32,
        precision="mixed_bfloat16",
        optimize_data=True,
        verbose=0,
    )
    assert p.precision == "mixed_bfloat16"
    monkeypatch.setattr(
        hardware, "detect_hardware", lambda nvml=True: Hardware(cpu=CPU)
    )
    p = kerascale.plan(dense_model(), mapped(), batch_size=32, optimize_data=False)
    assert p.precision == "float32"  # no bf16 here: the rule's float32, untried


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_optimize_data_is_validated(bad):
    with pytest.raises(kerascale.ConfigurationError, match="optimize_data="):
        kerascale.plan(dense_model(), mapped(), optimize_data=bad, verbose=0)
