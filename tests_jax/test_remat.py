"""Recomputation set in place (`kerascale.apply.remat`): Keras's own remat on
the model as it is, by XLA's count less memory, the same training to float
noise, and the model as it was afterwards."""

import keras
import numpy as np
import pytest

from kerascale import _keras_compat as keras_compat
from kerascale.apply import remat
from kerascale.measure.jax import compiled


def gelu_mlp(seed=0, depth=4, width=512):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((64,))
    h = inputs
    for _ in range(depth):
        h = keras.layers.Dense(width, activation="gelu")(h)
        h = keras.layers.Dropout(0.0)(h)  # its call takes training=
    model = keras.Model(inputs, keras.layers.Dense(10)(h))
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def data(n=256):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 64)).astype("float32"), rng.integers(0, 10, n)


def need(model, batch):
    x, y = data(2)
    step = compiled.StepMemory(model, compiled.element_of(x, y), None, 1)
    return step.need(batch).need_bytes


@pytest.mark.parametrize("mode", remat.MODES)
def test_recomputation_keeps_less_and_trains_the_same(mode):
    model = gelu_mlp()
    before = need(model, 256)
    undo = remat.apply(model, mode)
    recomputed = need(model, 256)
    assert recomputed < 0.7 * before, (recomputed, before)  # measured: 0.56
    x, y = data()
    fit = dict(batch_size=32, epochs=2, shuffle=False, verbose=0)
    losses = model.fit(x, y, **fit).history["loss"]
    undo()
    assert all(keras_compat.remat_mode(layer) is None for layer in model.layers)
    assert need(model, 256) == before  # as it was
    reference = gelu_mlp()
    np.testing.assert_allclose(
        losses, reference.fit(x, y, **fit).history["loss"], rtol=1e-6
    )
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_only_keras_s_activations_mode_is_offered():
    with pytest.raises(ValueError, match="recomputation mode"):
        remat.apply(gelu_mlp(), "full")


@pytest.mark.once  # its figures are one device's
def test_a_batch_that_does_not_fit_weighs_recomputation_against_accumulation():
    """512 asked under a 20 MiB device (XLA's count): 191 fit without
    recomputation, 512 with. For a run long enough to repay it (10,000
    epochs planned), whichever trained faster here is chosen; `fit` then
    trains that plan as the same plan does without the weighing; a short
    run does not weigh it."""
    import kerascale

    x, y = data(1024)
    settings = dict(batch_size=512, verbose=0, device_memory="20MiB")
    settings.update(precision="float32", remeasure=True)
    plan = kerascale.plan(gelu_mlp(), x, y, epochs=10_000, **settings)
    why = plan.reasons["recompute"]
    assert "with recomputation 512 per replica fit in one pass, without 191" in why
    assert "samples/s" in why  # both candidates ran for real
    fit = dict(epochs=2, shuffle=False, recompute=bool(plan.recompute), **settings)
    model = gelu_mlp()
    history = kerascale.fit(model, x, y, **fit)
    assert all(keras_compat.remat_mode(layer) is None for layer in model.layers)
    if plan.recompute:
        assert why.startswith("activations")
        assert (plan.micro_batch_size, plan.accumulation_steps) == (512, 1)
        reference = gelu_mlp().fit(
            x, y, batch_size=512, epochs=2, shuffle=False, verbose=0
        )
    else:
        assert why.startswith("not used")
        assert (plan.micro_batch_size, plan.accumulation_steps) == (128, 4)
        reference = kerascale.fit(gelu_mlp(), x, y, **{**fit, "recompute": "auto"})
        why = reference.plan.reasons["recompute"]
        assert "not weighed: the weighing would take" in why
    assert history.plan.micro_batch_size == plan.micro_batch_size
    np.testing.assert_allclose(
        history.history["loss"], reference.history["loss"], rtol=1e-5
    )
    short = kerascale.plan(gelu_mlp(), x, y, epochs=1, **settings)
    assert short.reasons["recompute"].code == "recompute.not_weighed"
    assert (
        short.reasons["recompute"].details["why"].startswith("the weighing would take")
    )


@pytest.mark.once
def test_find_batch_size_reports_the_bound_with_and_without_recomputation():
    import kerascale

    x, y = data(4096)
    found = kerascale.find_batch_size(
        gelu_mlp(), x, y, device_memory="20MiB", precision="float32", verbose=0
    )
    assert found.recompute_batch_size > 1.5 * found.batch_size
    assert found.reasons["recompute"].code == "search.with_recompute"
    plain = kerascale.find_batch_size(
        gelu_mlp(),
        x,
        y,
        device_memory="20MiB",
        precision="float32",
        recompute=False,
        verbose=0,
    )
    assert plain.recompute_batch_size is None
    assert plain.batch_size == found.batch_size
