"""One iterator over the epochs (TensorFlow; JAX keeps Keras's new
iterator each epoch, tests/jax_with_tf_child.py): a `tf.data` input that
kerascale prepares is read with `repeat()` and its batches an epoch as
`steps_per_epoch`, where that reads the same batches in the same order as
plain `fit`'s new iterator each epoch."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_data import plan_with

import kerascale
from kerascale.apply import data as apply_data
from kerascale.plan.data_changes import ONE_ITERATOR

EPOCHS, SAMPLES, BATCH = 3, 96, 16


def samples(n=SAMPLES):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) > 0).astype("float32")


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    m.compile(optimizer="adam", loss="mse")
    return m


class Steps(keras.callbacks.Callback):
    """Each epoch's batches, as the batch hooks see them, and Keras's
    `params["steps"]`."""

    def __init__(self):
        super().__init__()
        self.epochs, self.steps = [], None

    def on_train_begin(self, logs=None):
        self.steps = self.params.get("steps")

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.epochs[-1] += 1


def ours(ds, **kwargs):
    m, seen = model(), Steps()
    history = kerascale.fit(
        m,
        ds,
        batch_size=BATCH,
        precision="float32",
        epochs=EPOCHS,
        verbose=0,
        callbacks=[seen],
        **kwargs,
    )
    return m, history, seen


def plain(ds):
    m, seen = model(), Steps()
    m.fit(ds.batch(BATCH), epochs=EPOCHS, verbose=0, callbacks=[seen])
    return m, seen


def same_weights(a, b):
    for u, v in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(u, v)


def augmented():
    # A map kerascale runs in parallel, order kept.
    return tf.data.Dataset.from_tensor_slices(samples()).map(lambda x, y: (x * 2.0, y))


def test_a_pipeline_that_reads_the_same_each_epoch_gets_one_iterator():
    m, history, seen = ours(augmented())
    changes = history.plan.data_changes
    assert changes.one_iterator
    assert "one iterator over the epochs" in history.plan.describe(full=True)
    # What Keras's hooks see is plain fit's: the same epochs, batches and steps.
    reference, plain_seen = plain(augmented())
    assert seen.epochs == plain_seen.epochs == [SAMPLES // BATCH] * EPOCHS
    assert seen.steps == plain_seen.steps == SAMPLES // BATCH
    assert len(history.history["loss"]) == EPOCHS
    same_weights(m, reference)


def test_a_short_last_batch_stays_each_epochs_own():
    n = SAMPLES + 5  # 7 batches, the last of 5 samples
    ds = lambda: tf.data.Dataset.from_tensor_slices(samples(n))  # noqa: E731
    m, history, seen = ours(ds())
    assert history.plan.data_changes.one_iterator
    reference, plain_seen = plain(ds())
    assert seen.epochs == plain_seen.epochs == [7] * EPOCHS
    same_weights(m, reference)


def test_a_reshuffling_pipeline_keeps_kerass_iterator_each_epoch():
    # repeat() would draw one shuffle seed an epoch where Keras draws two:
    # another order than plain fit's after the first epoch.
    def ds():
        keras.utils.set_random_seed(0)
        return tf.data.Dataset.from_tensor_slices(samples()).shuffle(SAMPLES)

    _, history, _ = ours(ds())
    assert not history.plan.data_changes.one_iterator


def test_your_steps_per_epoch_and_a_backup_keep_it_off(tmp_path):
    _, history, seen = ours(augmented().repeat(), steps_per_epoch=4)
    assert not history.plan.data_changes.one_iterator
    assert seen.epochs == [4] * EPOCHS
    _, history, _ = ours(augmented(), checkpoint_dir=str(tmp_path / "ckpt"))
    assert not history.plan.data_changes.one_iterator
    _, history, _ = ours(augmented(), optimize_data=False)
    assert not history.plan.data_changes.one_iterator


def kept(x, y):
    return True


@pytest.mark.parametrize(
    "make, plan, steps, expected",
    [
        (lambda: augmented().batch(BATCH), plan_with(BATCH), 1, 6),
        (lambda: augmented().batch(BATCH), plan_with(BATCH), 3, 6),
        # Keras would run the third call of 4 on into the next epoch.
        (lambda: augmented().batch(BATCH), plan_with(BATCH), 4, None),
        (lambda: augmented().filter(kept).batch(BATCH), plan_with(BATCH), 1, None),
        (lambda: augmented().batch(BATCH).repeat(), plan_with(BATCH), 1, None),
        (lambda: augmented().batch(BATCH), plan_with(replicas=2, batch=32), 1, None),
        (lambda: augmented().batch(BATCH), plan_with(BATCH, backend="jax"), 1, None),
        (lambda: augmented().batch(BATCH), plan_with(BATCH, backend="torch"), 1, None),
        (lambda: augmented().shuffle(8).batch(BATCH), plan_with(BATCH), 1, None),
    ],
    ids=[
        "one",
        "divides",
        "crosses",
        "unknown",
        "infinite",
        "replicas",
        "jax",
        "unplanned",
        "shuffle",
    ],
)
def test_where_one_iterator_is_taken(make, plan, steps, expected):
    assert apply_data.one_iterator(make(), plan, steps) == expected


def test_the_plans_words_round_trip():
    changes = dataclasses.replace(plan_with(BATCH).data_changes, one_iterator=True)
    assert ONE_ITERATOR in changes.words()
    assert type(changes).from_saved(changes.to_dict()) == changes
    assert type(changes).from_saved(list(changes.words())) == changes
