"""CPU trials on JAX: where the rule keeps float32 only by a measurement on
other models (bf16 math that XLA's CPU code often gains nothing from), the
trials time the user's own model in both precisions on its data, and the
plan takes bf16 only where it ran faster; the model is left as it was."""

import keras
import numpy as np
import pytest
from conftest import toy_data

import kerascale
from kerascale.measure import budget, trial_bench
from kerascale.measure.decide import decide
from kerascale.measure.stages import Call
from kerascale.plan import precision as precision_rules
from kerascale.plan.options import Options
from kerascale.sense import hardware as hardware_lib


@pytest.fixture(autouse=True)
def _short_and_unbudgeted(monkeypatch):
    """Windows of 0.05 s (the same code, noisier figures), and no budget:
    the suite's runs are too short to repay what trials cost."""
    monkeypatch.setattr(trial_bench, "WINDOW_SECONDS", 0.05)
    monkeypatch.setattr(trial_bench, "WARMUP_SECONDS", 0.1)
    monkeypatch.setattr(budget, "REPAY", 0.0)


@pytest.fixture
def bf16_cpu(monkeypatch):
    """This CPU, said to have bf16 math (the seam: CI's may not)."""
    real = hardware_lib.detect_hardware()
    bf16 = {"bf16": True, "bf16_flags": ("avx512_bf16",)}
    cpu = real.cpu.__class__(**{**vars(real.cpu), **bf16})
    hw = real.__class__(**{**vars(real), "cpu": cpu})
    monkeypatch.setattr(hardware_lib, "detect_hardware", lambda: hw)
    return hw


def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(64, activation="relu")(inputs)
    out = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    out.compile("adam", "sparse_categorical_crossentropy")
    return out


def test_the_candidate_is_bf16_on_a_jax_cpu_with_bf16_only(bf16_cpu):
    assert bf16_cpu.cpu.bf16 and precision_rules.trial_candidate(bf16_cpu)
    plain = bf16_cpu.__class__(
        **{
            **vars(bf16_cpu),
            "cpu": bf16_cpu.cpu.__class__(
                **{**vars(bf16_cpu.cpu), "bf16": False, "bf16_flags": ()}
            ),
        }
    )
    assert precision_rules.trial_candidate(plain) == ""


def test_trials_time_both_precisions_and_leave_the_model_as_it_was(bf16_cpu):
    x, y = toy_data(n=1024, inputs=16)
    ours = model()
    before = [w.copy() for w in ours.get_weights()]
    options = Options.validate(batch_size=64)
    decided = decide(ours, x, y, options, call=Call(epochs=5), hardware=bf16_cpu)
    trials = {t.precision: t for t in decided.trials.trials}
    assert set(trials) == {"float32", "mixed_bfloat16"}
    assert all(t.samples_per_s > 0 and len(t.repeats) == 3 for t in trials.values())
    chosen = decided.plan.precision
    why = decided.plan.reasons["precision"]
    assert "measured on your data" in why and "mixed_bfloat16" in why, why
    if chosen == "mixed_bfloat16":  # only where it ran faster
        assert trials[chosen].samples_per_s > trials["float32"].samples_per_s
    else:
        assert chosen == "float32"
    # The user's model: its weights, its policy, no distribution left set.
    for a, b in zip(before, ours.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours.dtype_policy.name == "float32"
    assert all(layer.dtype_policy.name == "float32" for layer in ours.layers)
    assert keras.distribution.distribution() is None


def test_fit_after_its_trials_trains_as_plain_fit(bf16_cpu, monkeypatch):
    # Whatever the trials find, float32 here, so the run compares exactly.
    from kerascale.measure import trials as trials_lib

    monkeypatch.setattr(trials_lib, "_better", lambda plain, other: (plain.key, False))
    x, y = toy_data(n=1024, inputs=16)
    ours = model()
    keras.utils.set_random_seed(7)  # the shuffle's
    history = kerascale.fit(ours, x, y, batch_size=64, epochs=2, verbose=0)
    assert history.plan.precision == "float32"
    assert history.plan.reasons["precision"].code == "trials.measured"
    if history.plan.replicas > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    theirs = model()
    keras.utils.set_random_seed(7)
    expected = theirs.fit(x, y, batch_size=64, epochs=2, verbose=0)
    np.testing.assert_allclose(
        history.history["loss"], expected.history["loss"], rtol=1e-5
    )


def test_a_cpu_auto_batch_is_keras_s_and_compiles_nothing(bf16_cpu, monkeypatch):
    """However long the run (no budget here), a CPU's "auto" batch is Keras's
    32: the fastest batch in samples per second is not the fastest to an
    accuracy (issue 78). No ladder is compiled or timed; the plan says why."""
    from kerascale.measure.jax import search as jax_search

    def searched(*args, **kwargs):
        raise AssertionError("a CPU's auto batch was searched")

    monkeypatch.setattr(jax_search.XlaAnalysis, "searched", searched)
    monkeypatch.setattr(budget, "REPAY", 0.0)
    x, y = toy_data(n=2048, inputs=16)
    call = Call(epochs=50)
    decided = decide(model(), x, y, Options.validate(), call=call, hardware=bf16_cpu)
    assert decided.search is None
    assert not [t for t in decided.trials.trials if t.stage == "batch"]
    assert decided.plan.micro_batch_size == 32
    why = decided.plan.reasons["global_batch_size"]
    assert why.code == "batch.keras_default"
    assert "not the fastest to an accuracy" in why.details["note"]


def test_a_short_run_keeps_keras_default_batch_and_says_why(bf16_cpu, monkeypatch):
    monkeypatch.setattr(budget, "REPAY", 1.0)
    x, y = toy_data(n=2048, inputs=16)
    plan = kerascale.plan(model(), x, y, epochs=1, verbose=0)
    assert plan.global_batch_size == 32 * plan.replicas
    why = plan.reasons["global_batch_size"]
    assert why.code == "batch.keras_default"
    assert why.details["note"].startswith("batch search skipped: ")
