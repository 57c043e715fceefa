"""Saves written behind training, checked the same way on both backends
(tests/test_backup.py, tests_jax/test_jax_backup.py): the write's thread
against the training thread, one save in flight, what `Throughput` says of
the waits, and failed background writes, on a real file system."""

import threading
import time
import warnings

import keras
import numpy as np
import pytest

from kerascale.callbacks import FaultTolerantBackup, Throughput
from kerascale.callbacks import backup as backup_lib
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import CheckpointError, KerascaleWarning

STEPS, EPOCHS = 8, 3  # 128 samples in batches of 16


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile("adam", "mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 16, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


class _Steps(keras.callbacks.Callback):
    """Counts the steps trained, and sleeps a little in each (a step's
    length, so that a write spans several)."""

    def __init__(self, sleep=0.02):
        super().__init__()
        self.done, self.sleep = 0, sleep

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        time.sleep(self.sleep)


def _slow_writes(monkeypatch, steps, seconds):
    """Each save's write takes `seconds` more; returns what each write saw:
    (the steps done when it began, when it ended) and the most writes in
    flight at once."""
    seen, flight = [], {"now": 0, "most": 0}
    lock = threading.Lock()
    real = store.publish

    def publish(directory, number, write_state, meta, before_commit=None):
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        began = steps.done
        try:
            time.sleep(seconds)
            return real(directory, number, write_state, meta, before_commit)
        finally:
            seen.append((began, steps.done))
            with lock:
                flight["now"] -= 1

    monkeypatch.setattr(store, "publish", publish)
    return seen, flight


def check_writes_run_behind_training(tmp_path, monkeypatch):
    """Saves every 2 steps, each write 0.3 s, steps of 0.02 s: training goes
    on while a save is written (the steps move during writes), one save at
    a time, so a save that comes due waits for the one before, and
    `Throughput` says how long; after `fit` returns, the last save is
    published and holds the end of training. A wait longer than
    `SLOW_WRITE_SECONDS` (0.2 s here) is said once, with what to do."""
    steps = _Steps()
    seen, flight = _slow_writes(monkeypatch, steps, 0.3)
    monkeypatch.setattr(backup_lib, "SLOW_WRITE_SECONDS", 0.2)
    backup = FaultTolerantBackup(str(tmp_path), save_freq=2, verbose=0)
    throughput = Throughput(16)
    x, y = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _model().fit(
            x,
            y,
            batch_size=16,
            epochs=EPOCHS,
            verbose=0,
            callbacks=[backup, throughput, steps],
        )
    said = [str(w.message) for w in caught if "Save less often" in str(w.message)]
    assert len(said) == 1 and "save_freq=2" in said[0], said
    assert flight["most"] == 1
    assert any(end > began for began, end in seen), seen  # trained meanwhile
    assert len(backup.save_seconds) == len(seen) == STEPS * EPOCHS // 2
    # The saves that found no write in flight held training for the copy
    # only, far less than a write; the others waited for the one before.
    alone = [
        b
        for b, w in zip(backup.save_seconds, backup.waited_seconds, strict=True)
        if w < 0.01
    ]
    assert alone and max(alone) < 0.3, backup.save_seconds
    waited = sum(backup.waited_seconds)
    assert waited > 0.3, backup.waited_seconds
    said = sum(e["checkpoint_wait_seconds"] for e in throughput.epochs_seen)
    held = sum(e["checkpoint_seconds"] for e in throughput.epochs_seen)
    assert said == pytest.approx(waited, abs=0.05)
    assert held == pytest.approx(sum(backup.save_seconds), abs=0.05)
    assert "saves held (waiting)" in throughput.summary()
    newest = store.scan(str(tmp_path))[0]
    meta = store.verify(newest)
    assert backup.last_checkpoint == newest.path
    assert (meta["global_step"], meta["finished"]) == (STEPS * EPOCHS, True)
    assert not backup.failed_saves
    assert not backup._buffers._arrays  # the copy's memory is given back


def check_a_failed_write_warns_and_the_next_is_tried(tmp_path):
    """The 2nd save's directory name is taken by a file: its write fails in
    the background (a real error of the file system, as root too), which is
    said once, at a later step; training goes on, the 3rd save is written,
    and the failed one is never reported as saved."""
    (tmp_path / store.name(2)).write_text("in the way")
    backup = FaultTolerantBackup(str(tmp_path), save_freq=4, verbose=0)
    x, y = _data()
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[backup])
    said = [str(w.message) for w in caught if w.category is KerascaleWarning]
    failed = [m for m in said if "could not be written" in m]
    assert len(failed) == 1 and store.name(2) in failed[0], said
    assert "next save is tried" in failed[0]
    assert backup.failed_saves == [2]
    assert int(model.optimizer.iterations) == 2 * STEPS  # trained to the end
    complete = [f for f in store.scan(str(tmp_path)) if f.state == "complete"]
    assert [f.number for f in complete] == [4, 3]  # keep=2; 2 never existed
    assert backup.last_checkpoint == complete[0].path
    assert store.verify(complete[0])["global_step"] == 2 * STEPS


def check_writes_that_keep_failing_stop_training(tmp_path):
    """Saves 2, 3 and 4 fail: at the third failure in a row training stops
    with CheckpointError, saying since when nothing protects the run; the
    1st checkpoint is intact."""
    for number in (2, 3, 4):
        (tmp_path / store.name(number)).write_text("in the way")
    backup = FaultTolerantBackup(str(tmp_path), save_freq=2, verbose=0)
    x, y = _data()
    with warnings.catch_warnings(), pytest.raises(CheckpointError) as e:
        warnings.simplefilter("ignore")
        _model().fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0, callbacks=[backup])
    message = str(e.value)
    assert "The last 3 checkpoints could not be written" in message
    assert store.name(1) in message and str(tmp_path) in message
    assert backup.failed_saves == [2, 3, 4]
    (first,) = [f for f in store.scan(str(tmp_path)) if f.state == "complete"]
    assert store.verify(first)["global_step"] == 2
