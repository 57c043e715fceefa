"""The bounds on an "auto" steps per call (kerascale.plan.steps) and the
callbacks that hold it at 1 (kerascale.sense.callback_hooks)."""

import keras
import pytest

from kerascale.callbacks import FaultTolerantBackup, ProfileWindow, TimeBudget
from kerascale.callbacks.fit_callbacks import Monitoring, steps_limit
from kerascale.errors import ConfigurationError
from kerascale.measure.host_path import HostPath
from kerascale.plan import steps
from kerascale.plan.options import Options
from kerascale.sense.callback_hooks import overridden_hook


def test_the_largest_value_divides_what_the_run_needs():
    limit = steps.for_run(hook=None, save_every=50, profile=None)
    assert limit.largest(25) == (25, "")
    n, why = limit.largest(16)
    assert n == 10 and "a save every 50 updates" in why
    # With accumulation of 4 micro-batches, a save every 50 updates is one
    # every 200 batches, and a call ends at an update's end.
    assert limit.largest(16, accumulation=4)[0] == 8
    n, why = steps.StepsLimit().largest(10, accumulation=4)
    assert n == 8 and "accumulation window of 4" in why
    assert steps.StepsLimit().largest(3, accumulation=4) == (
        2,
        "2, not 3, so that the calls fit an accumulation window of 4",
    )


def test_a_batch_hook_or_a_profile_window_holds_it_at_one():
    held = steps.for_run(hook=("your X", "on_batch_end"), save_every=None, profile=None)
    n, why = held.largest(64)
    assert n == 1 and "your X overrides on_batch_end" in why
    profiled = steps.for_run(hook=None, save_every=None, profile=(3, 5))
    assert profiled.largest(64)[0] == 1 and "profile=(3, 5)" in profiled.largest(64)[1]


class _Hooked(keras.callbacks.Callback):
    def on_test_batch_begin(self, batch, logs=None):
        pass


class _EpochOnly(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


@pytest.mark.parametrize(
    "callback, held",
    [
        (keras.callbacks.ProgbarLogger(), None),
        (keras.callbacks.History(), None),
        (keras.callbacks.EarlyStopping(), None),
        (keras.callbacks.ModelCheckpoint("/tmp/m.keras"), None),
        (
            keras.callbacks.ModelCheckpoint("/tmp/m.keras", save_freq=5),
            ("Keras's ModelCheckpoint", "on_train_batch_end"),
        ),
        (keras.callbacks.TensorBoard("/tmp/tb"), None),
        (
            keras.callbacks.TensorBoard("/tmp/tb", profile_batch=(2, 3)),
            ("Keras's TensorBoard", "on_train_batch_begin"),
        ),
        (
            keras.callbacks.TerminateOnNaN(),
            ("Keras's TerminateOnNaN", "on_batch_end"),
        ),
        (
            keras.callbacks.LambdaCallback(on_batch_end=lambda batch, logs: None),
            ("Keras's LambdaCallback", "on_batch_end"),
        ),
        (keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None), None),
        (_Hooked(), ("your _Hooked", "on_test_batch_begin")),
        (_EpochOnly(), None),
        (FaultTolerantBackup("/tmp/ckpt-hooks"), None),
        (TimeBudget(60), None),
        (
            ProfileWindow("/tmp/tb", 2, 3),
            ("kerascale's ProfileWindow", "on_train_batch_begin"),
        ),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, tuple | type(None)) else "",
)
def test_which_callbacks_hold_it_at_one(callback, held):
    found = overridden_hook([callback])
    assert found == held


def test_a_backup_of_a_reshuffled_tf_data_pipeline_holds_it_at_one():
    """Its resume at several steps a call takes another epoch order now and
    then on TensorFlow (the open finding in docs/conformance.md)."""
    import numpy as np
    import tensorflow as tf

    samples = tf.data.Dataset.from_tensor_slices(np.zeros((64, 2), "float32"))
    shuffled, in_order = samples.shuffle(64, seed=1).batch(8), samples.batch(8)
    backups = [FaultTolerantBackup("/tmp/c")]
    n, why = steps_limit(backups, Monitoring(), shuffled).largest(8)
    assert n == 1 and "reshuffles each epoch" in why, why
    assert steps_limit([], Monitoring(), shuffled).largest(8)[0] == 8
    assert steps_limit(backups, Monitoring(), in_order).largest(8)[0] == 8


def test_a_backups_save_every_n_updates_bounds_it():
    backups = [FaultTolerantBackup("/tmp/a", save_freq=12)]
    limit = steps_limit(backups, Monitoring())
    assert limit.largest(8)[0] == 6
    assert steps_limit([FaultTolerantBackup("/tmp/b")], Monitoring()).largest(8) == (
        8,
        "",
    )


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4", None])
def test_steps_per_execution_is_checked_at_the_door(bad):
    with pytest.raises(ConfigurationError, match="steps_per_execution"):
        Options.validate(steps_per_execution=bad)


def test_the_host_share_comes_from_the_two_timings():
    found = HostPath(t1=1e-3, tk=4e-4, k=16)
    assert found.per_call == pytest.approx(6.4e-4)
    assert found.share == pytest.approx(0.64)
    assert HostPath(t1=1e-3, tk=1.1e-3, k=16).share == 0.0


def test_auto_takes_a_divisor_of_steps_per_epoch():
    """An iterator that runs on across epochs: only a divisor keeps each
    epoch's steps (Keras runs a call whole past the epoch's end)."""
    limit = steps.StepsLimit(divides=((6, "steps_per_epoch=6"),))
    assert limit.largest(4) == (
        3,
        "3, not 4, so that the calls fit steps_per_epoch=6",
    )


def test_several_replicas_on_tensorflow_keep_one_step_a_call():
    """keras-team/keras#19246: a value of yours is dropped with a warning."""
    from test_reasons import gpu_box

    from kerascale.plan import reasons
    from kerascale.plan.rules import make_plan
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.model_facts import ModelFacts

    data = DataFacts(kind="dataset", batched=True, batch_size=64)
    plan = make_plan(gpu_box(2), Options.validate(), ModelFacts(), data)
    assert plan.steps_per_execution == 1
    assert reasons.code(plan.reasons["steps_per_execution"]) == "steps.replicas"
    assert not any("steps_per_execution" in w for w in plan.warnings)
    asked = make_plan(
        gpu_box(2), Options.validate(steps_per_execution=8), ModelFacts(), data
    )
    assert asked.steps_per_execution == 1
    said = [w for w in asked.warnings if "steps_per_execution=8" in w]
    assert len(said) == 1 and "keras-team/keras#19246" in said[0]
    compiled = make_plan(
        gpu_box(2), Options.validate(), ModelFacts(steps_per_execution=4), data
    )
    assert compiled.steps_per_execution == 1
    assert any("steps_per_execution=4 (your compile's)" in w for w in compiled.warnings)
    one = make_plan(
        gpu_box(1), Options.validate(steps_per_execution=8), ModelFacts(), data
    )
    assert one.steps_per_execution == 8
