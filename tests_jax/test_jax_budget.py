"""The run's first estimate on JAX: a compiled forward pass scaled by XLA's
count of a training step, not eager passes (which dispatch and compile op
by op, and read a JAX run 3-4x short at about 0.8 s a call)."""

import keras
import numpy as np
import pytest
from conftest import toy_data

from kerascale.measure import first_step
from kerascale.measure.jax import estimate
from kerascale.sense import data_facts


def _model(width: int = 1024) -> keras.Model:
    """BatchNormalization and Dropout (state a step changes), and large
    enough to be compiled (`estimate.MIN_FLOPS`) at the default width."""
    inputs = keras.Input((256,))
    h = keras.layers.BatchNormalization()(inputs)
    h = keras.layers.Dense(width, activation="relu")(h)
    h = keras.layers.Dropout(0.5)(keras.layers.Dense(width, activation="relu")(h))
    model = keras.Model(inputs, keras.layers.Dense(2)(h))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_estimate_is_compiled_and_leaves_the_model_alone(monkeypatch, policy):
    """On 1 and on 2 devices (the suite's two JAX runs), in both precisions."""

    def eager(*args):
        raise AssertionError("the eager forward pass ran on JAX")

    monkeypatch.setattr(first_step, "_forward_seconds", eager)
    keras.config.set_dtype_policy(policy)
    model = _model()
    x, y = toy_data(64, inputs=256)
    before = [np.array(v.value) for v in model.variables]

    per = first_step.train_seconds_per_sample(
        model, x, y, data_facts.inspect(x, y, steps_per_epoch=None)
    )

    assert per is not None and 0 < per < 0.1
    for a, v in zip(before, model.variables, strict=True):
        np.testing.assert_array_equal(a, np.array(v.value))


@pytest.mark.once
def test_xla_counts_a_training_step_against_the_forward_pass(monkeypatch):
    """The scale comes from XLA's counts (a training step of dense layers:
    2-3 forward passes), not the fallback ratio; fails if
    `Lowered.cost_analysis` stops giving "flops"."""
    counted = []
    real = estimate._flops
    monkeypatch.setattr(
        estimate, "_flops", lambda lowered: counted.append(real(lowered)) or counted[-1]
    )
    model = _model()
    x, _ = toy_data(64, inputs=256)

    estimate.train_seconds_per_sample(model, lambda b: x[:b], 1000.0)

    forward, step = counted
    assert forward > estimate.MIN_FLOPS and 1.5 < step / forward < 4


@pytest.mark.once
def test_a_model_it_cannot_trace_gets_the_eager_figure(monkeypatch):
    def untraceable(*args, **kwargs):
        raise TypeError("not traceable")

    monkeypatch.setattr(estimate, "train_seconds_per_sample", untraceable)
    model = _model()
    x, y = toy_data(64, inputs=256)
    per = first_step.train_seconds_per_sample(
        model, x, y, data_facts.inspect(x, y, steps_per_epoch=None)
    )
    assert per is not None and per > 0


@pytest.mark.once
def test_a_small_model_keeps_the_eager_figure():
    """Its compile would cost 80-110 ms a `fit` call, its eager passes 3-5."""
    x, _ = toy_data(64, inputs=256)
    for width in (2, 128):  # not even lowered; lowered and counted under MIN_FLOPS
        model = _model(width)
        assert estimate.train_seconds_per_sample(model, lambda b: x[:b], 2.0) is None


@pytest.mark.once
def test_the_process_s_first_estimate_is_compiled_for_a_small_model_too():
    """The process's first estimate: no eager operation is compiled yet, so
    the eager figure would pay each one's compile (0.67 s against 0.17 s for
    issue 78's notebook MLP); a model too small even to lower stays eager."""
    x, _ = toy_data(64, inputs=256)
    small = estimate.train_seconds_per_sample(_model(128), lambda b: x[:b], 2.0)
    first = estimate.train_seconds_per_sample(
        _model(128), lambda b: x[:b], 2.0, first=True
    )
    assert small is None and first is not None and 0 < first < 1e-2
    tiny = estimate.train_seconds_per_sample(
        _model(2), lambda b: x[:b], 2.0, first=True
    )
    assert tiny is None
