"""tf.data's autotuning off on the pipelines kerascale prepares: dropping an
iterator then does not wait for the autotuning thread (Keras drops one each
epoch and one at the end of `fit`), and what trains is plain fit's. A
pipeline whose own options set autotuning keeps it as set."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_data import plan_with

import kerascale
from kerascale.apply import data as apply_data
from kerascale.plan.data_changes import AUTOTUNE_OFF, DataChanges
from kerascale.sense import data_facts

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly

EPOCHS, SAMPLES, BATCH = 2, 96, 16


def samples(n=SAMPLES):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) > 0).astype("float32")


def augmented(autotune=None):
    ds = tf.data.Dataset.from_tensor_slices(samples()).map(lambda x, y: (x * 2.0, y))
    if autotune is None:
        return ds
    options = tf.data.Options()
    options.autotune.enabled = autotune
    return ds.with_options(options)


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, "relu"), keras.layers.Dense(1)]
    )
    m.compile(optimizer="adam", loss="mse")
    return m


def prepared(ds, optimize=True):
    facts = data_facts.inspect(ds)
    return apply_data.prepare(ds, facts, plan_with(BATCH), optimize=optimize)


def test_a_pipeline_kerascale_prepares_trains_with_autotuning_off():
    out = prepared(augmented())
    assert out.options().autotune.enabled is False
    m = model()
    history = kerascale.fit(
        m,
        augmented(),
        batch_size=BATCH,
        precision="float32",
        epochs=EPOCHS,
        verbose=0,
        validation_data=augmented(),
    )
    assert history.plan.data_changes.autotune_off
    assert AUTOTUNE_OFF in str(history.plan.data_changes)
    # The same batches in the same order: plain fit's weights.
    reference = model()
    reference.fit(
        augmented().batch(BATCH),
        epochs=EPOCHS,
        verbose=0,
        validation_data=augmented().batch(BATCH),
    )
    for a, b in zip(m.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(
        history.history["val_loss"], reference.history.history["val_loss"], rtol=1e-6
    )


def test_validation_data_kerascale_batches_has_it_off_too():
    val, _ = apply_data.prepare_validation(augmented(), plan_with(BATCH), optimize=True)
    assert val.options().autotune.enabled is False


def test_your_own_autotuning_option_is_kept_either_way():
    for yours in (True, False):
        facts = data_facts.inspect(augmented(yours))
        assert facts.autotune_set
        out = apply_data.prepare(
            augmented(yours), facts, plan_with(BATCH), optimize=True
        )
        assert out.options().autotune.enabled is yours
        # Nor does the plan claim it.
        plan = kerascale.plan(
            model(), augmented(yours), batch_size=BATCH, precision="float32"
        )
        assert not plan.data_changes.autotune_off


def test_optimize_data_false_leaves_the_pipeline_as_given():
    out = prepared(augmented(), optimize=False)
    assert out.options().autotune.enabled is None  # TensorFlow's default: on


def test_data_optimize_turns_it_off_and_says_so():
    assert AUTOTUNE_OFF in kerascale.data.optimize_report(augmented())
    out = kerascale.data.optimize(augmented())
    assert out.options().autotune.enabled is False
    assert AUTOTUNE_OFF not in kerascale.data.optimize_report(augmented(True))
    assert kerascale.data.optimize(augmented(True)).options().autotune.enabled


def test_a_saved_plans_field_this_kerascale_no_longer_has_is_dropped():
    # 2026-12-05's kerascale saved `one_iterator` in a checkpoint's plan.
    saved = {"batch": 32, "prefetch": True, "one_iterator": True}
    assert DataChanges.from_saved(saved) == DataChanges(batch=32, prefetch=True)
    changes = DataChanges(batch=32, prefetch=True, autotune_off=True)
    assert DataChanges.from_saved(changes.to_dict()) == changes
