"""The run's controller and its batch lever, checked on both backends
(tests/test_batch_growth.py, tests_jax/test_jax_batch_growth.py)."""

import csv
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import kerascale
from kerascale.apply import batch_growth, steps_in_run
from kerascale.apply.controller import Controller, Lever
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import KerascaleWarning
from kerascale.plan import goodput

SAMPLES = 256
# One replica, also where JAX has several devices (the jax_2dev lane): the
# batch grows on one replica only (several keep it, and say so).
ONE = {"strategy": "default"}


def data(samples=SAMPLES, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)) > 0).astype("float32")
    return x, y


def model(optimizer=None, seed=0):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    m.compile(optimizer or keras.optimizers.Adam(1e-3), "binary_crossentropy")
    return m


class Scripted(Lever):
    """Proposes the batches of `script` (epoch -> batch) and notes when it
    was asked: a deterministic stand-in for a measurement."""

    def __init__(self, script):
        super().__init__()
        self.script, self.asked, self.finished = dict(script), [], 0

    def propose(self, epoch, logs):
        self.asked.append(epoch)
        batch = self.script.get(epoch)
        return None if batch is None else {"batch_size": batch}

    def finish(self):
        self.finished += 1


class Recorder(keras.callbacks.Callback):
    """What a callback of the user's sees of the run."""

    def __init__(self):
        super().__init__()
        self.begins = self.ends = 0
        self.epochs, self.steps, self.rates = [], [], []

    def on_train_begin(self, logs=None):
        self.begins += 1

    def on_train_end(self, logs=None):
        self.ends += 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)
        self.steps.append(self.params["steps"])
        rate = self.model.optimizer.learning_rate
        self.rates.append(float(keras.ops.convert_to_numpy(rate)))


def controlled_fit(m, x, y, callbacks, levers, in_step=(), told=None, **kwargs):
    """`m.fit` under a controller, as kerascale's run calls it; `in_step`:
    callbacks after the controller's own, whose `on_train_batch_begin` is
    then inside the step as the controller counts it."""
    controller = Controller(levers, callbacks)
    if told is not None:
        controller.followers.append(lambda a: told.append(a["batch_size"]))
    arguments = {"batch_size": 32, "verbose": 0, **kwargs}
    arguments["callbacks"] = [*controller.wrapped(callbacks), *in_step]
    history = controller.run(lambda a: m.fit(x, y, **a), arguments)
    return history, controller


def check_one_run_across_changes():
    x, y = data()
    seen, lever, told = Recorder(), Scripted({0: 64, 2: 128}), []
    history, controller = controlled_fit(
        model(), x, y, [seen], [lever], told=told, epochs=5
    )
    # Each later segment's batch, then the first's again at the run's end.
    assert told == [64, 128, 32]
    assert (seen.begins, seen.ends) == (1, 1)
    assert seen.epochs == [0, 1, 2, 3, 4]
    assert seen.steps == [8, 4, 4, 2, 2]  # 256 samples at 32, 64, 128
    assert history.epoch == [0, 1, 2, 3, 4]
    assert len(history.history["loss"]) == 5
    assert history.model.history is history
    assert [start for start, _ in controller.changes] == [1, 3]
    assert lever.asked == [0, 1, 2, 3]  # never at the last epoch
    assert lever.finished == 1
    assert not any(hook in vars(seen) for hook in ("on_train_begin", "on_train_end"))


def check_early_stopping_keeps_its_patience():
    """`EarlyStopping` counts its patience over the whole run: reset at a
    change, it would stop two epochs later than in one `fit`."""
    x, y = data()

    def stopper():  # the loss falls: in "max" mode it never improves
        return keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=2)

    plain = model().fit(x, y, batch_size=32, epochs=8, verbose=0, callbacks=[stopper()])
    lever = Scripted({0: 64, 1: 128})
    history, _ = controlled_fit(model(), x, y, [stopper()], [lever], epochs=8)
    assert len(plain.epoch) == 3
    assert history.epoch == plain.epoch
    # The stopping epoch asked no lever.
    assert lever.asked == [0, 1]


def check_csv_logger_writes_one_file(path):
    x, y = data()
    logger = keras.callbacks.CSVLogger(str(path))
    controlled_fit(model(), x, y, [logger], [Scripted({0: 64, 1: 128})], epochs=4)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]


def check_an_error_leaves_the_callbacks_as_they_were():
    x, y = data()

    class Fails(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("the user's callback failed")

    seen, fails, lever = Recorder(), Fails(), Scripted({0: 64, 1: 128})
    try:
        controlled_fit(model(), x, y, [seen, fails], [lever], epochs=4)
    except RuntimeError as e:
        assert "failed" in str(e)
    else:
        raise AssertionError("the error was swallowed")
    for callback in (seen, fails, lever):
        assert "on_train_begin" not in vars(callback)
        assert "on_train_end" not in vars(callback)
    assert lever.finished == 1


def forced(monkeypatch, script):
    """`goodput.grow` answers `script` (epoch -> batch) and "stay" at any
    other epoch: the lever's decisions made deterministic."""
    calls = []

    def grow(current, base, noise, step_seconds, **kwargs):
        calls.append(current)
        batch = script.get(len(calls) - 1, current)
        return goodput.Growth(batch, noise or 0.0, {}, None, 1.0)

    monkeypatch.setattr(goodput, "grow", grow)
    monkeypatch.setattr(batch_growth, "TIMED_STEPS", 1)
    return calls


def check_the_learning_rate_follows_the_batch(monkeypatch):
    """Adam at 1e-3 grows 32 -> 64 -> 128: the rate is x sqrt(2) then x 2
    of yours, a `ReduceLROnPlateau`'s cuts are kept through both, and the
    rate after the run is yours with the cuts."""
    x, y = data(samples=2048)
    calls = forced(monkeypatch, {0: 64, 1: 128})
    seen = Recorder()
    plateau = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", mode="max", factor=0.5, patience=1, min_lr=0.0
    )
    m = model()
    history = kerascale.fit(
        m,
        x,
        y,
        epochs=6,
        callbacks=[plateau, seen],
        verbose=0,
        precision="float32",
        steps_per_execution=1,
        **ONE,
    )
    assert history.plan.reasons["batch_growth"].code == "growth.in_run"
    # A batch is asked about once timed past its first epoch: the base at
    # epoch 1's end, 64 at epoch 3's.
    assert calls == [32, 64]
    assert history.history["batch_size"] == [32, 32, 64, 64, 128, 128]
    # "max" on a falling loss: a cut at every epoch's end from the second.
    lr, root = 1e-3, 2**0.5
    expected = [lr, lr, lr * root / 2, lr * root / 4, lr / 4, lr / 8]
    np.testing.assert_allclose(seen.rates, expected, rtol=1e-5)
    # Five cuts, and kerascale's factor (2 at 128) taken out.
    rate = float(keras.ops.convert_to_numpy(m.optimizer.learning_rate))
    np.testing.assert_allclose(rate, lr / 32, rtol=1e-5)
    assert (seen.begins, seen.ends) == (1, 1)


def check_a_kept_batch_trains_model_fit_s_weights(monkeypatch):
    """Where the lever measures and keeps the batch, the weights are plain
    `fit`'s: its measurements leave no trace."""
    x, y = data(samples=2048)
    calls = forced(monkeypatch, {})
    plain = model()
    plain.fit(x, y, batch_size=32, epochs=4, verbose=0, shuffle=False)
    grown = model()
    history = kerascale.fit(
        grown, x, y, epochs=4, verbose=0, shuffle=False, precision="float32", **ONE
    )
    # Asked at epoch 0's end (the steps lever timed the base's step) and
    # at 1's and 2's (the base timed past its first epoch).
    assert calls == [32, 32, 32]
    assert history.plan.reasons["batch_growth"].code == "growth.in_run"
    for a, b in zip(plain.get_weights(), grown.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def check_the_batch_joins_the_steps_first_move(monkeypatch):
    """Where the steps lever moves at the run's first epoch's end, the
    batch may move with it: one new segment and one compile for both, two
    epochs sooner than the batch alone (which waits for its base timed
    past a first epoch)."""
    monkeypatch.setattr(steps_in_run, "REPAY", 0.0)  # the move repays itself
    calls = forced(monkeypatch, {0: 64})
    segments = []
    real = Controller.run

    def run(self, *args, **kwargs):
        try:
            return real(self, *args, **kwargs)
        finally:
            segments.append(list(self.changes))

    monkeypatch.setattr(Controller, "run", run)
    x, y = data(samples=2048)
    m = model()
    history = kerascale.fit(m, x, y, epochs=4, verbose=0, precision="float32", **ONE)
    assert calls[0] == 32  # asked at the first epoch's end
    assert history.history["batch_size"] == [32, 64, 64, 64]
    [changes] = segments
    (epoch, change), *later = changes
    assert epoch == 1 and change["batch_size"] == 64
    assert change["steps_per_execution"] > 1
    # Later, at most the steps lever's check of its value (timed: a busy
    # machine may send it back to one a call); the batch stays.
    assert all(set(c) == {"steps_per_execution"} for _, c in later)
    n = later[-1][1]["steps_per_execution"] if later else change["steps_per_execution"]
    assert history.plan.steps_per_execution == n
    assert m.steps_per_execution == 1  # yours again after the run


def check_a_real_run_grows_or_says_why():
    """The lever unforced on a run long enough to measure: every epoch's
    batch and noise scale in `History`, a batch that only grows from
    Keras's 32 by doublings, and your learning rate back after."""
    x, y = data(samples=4096)
    m = model()
    history = kerascale.fit(m, x, y, epochs=4, verbose=0, validation_split=0.25, **ONE)
    batches = history.history["batch_size"]
    assert len(batches) == 4 and batches[0] == 32
    assert all(b in (32, 64, 128, 256) for b in batches)
    noise = history.history["noise_scale"]
    assert len(noise) == 4 and all(np.isnan(n) or n >= 0 for n in noise)
    rate = float(keras.ops.convert_to_numpy(m.optimizer.learning_rate))
    np.testing.assert_allclose(rate, 1e-3, rtol=1e-6)
    assert history.plan.reasons["batch_growth"].code == "growth.in_run"


class FailsAtBatch(keras.callbacks.Callback):
    """Raises at the first step of an epoch of `steps` steps: a stand-in for
    a batch that does not fit (a deterministic OOM threshold)."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def on_train_batch_begin(self, batch, logs=None):
        if self.params["steps"] == self.steps:
            raise MemoryError("the seam: this batch does not fit")


def check_a_change_whose_first_step_fails_is_undone_with_one_warning():
    import warnings

    x, y = data()
    seen, lever = Recorder(), Scripted({0: 64, 1: 128})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        told = []
        history, controller = controlled_fit(
            model(), x, y, [seen], [lever], [FailsAtBatch(4)], told, epochs=4
        )
    assert told == [64, 32, 128, 32]  # the undone change told too
    said = [str(w.message) for w in caught if w.category is KerascaleWarning]
    assert len(said) == 1 and "MemoryError" in said[0] and "64" in said[0]
    # Epoch 1 began at 64 (4 steps), failed, and ran again at 32; the lever
    # then asked for 128 at epoch 1's end, which trained.
    assert seen.epochs == [0, 1, 1, 2, 3]
    assert seen.steps == [8, 4, 8, 2, 2]
    assert history.epoch == [0, 1, 2, 3]
    assert [change for _, change in controller.changes] == [{"batch_size": 128}]
    assert (seen.begins, seen.ends) == (1, 1)


def check_a_noise_scale_that_cannot_be_measured_drops_growth_with_one_warning(
    monkeypatch,
):
    import warnings

    from kerascale.apply import gradient_noise

    def fails(*args, **kwargs):
        raise ValueError("the seam: no gradient here")

    monkeypatch.setattr(gradient_noise, "sample", fails)
    # Compiles made free: a run this short measures (once its base batch is
    # timed past a first epoch: the steps lever's timing left out).
    monkeypatch.setattr(batch_growth.EpochTimes, "switch_seconds", lambda self: 0.0)
    monkeypatch.setattr(steps_in_run.StepsInRun, "timed_at_one", lambda self: None)
    x, y = data(samples=2048)
    m = model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(
            m, x, y, epochs=4, verbose=0, precision="float32", **ONE
        )
    said = [str(w.message) for w in caught if w.category is KerascaleWarning]
    assert len(said) == 1 and "measuring the noise scale failed" in said[0]
    assert history.history["batch_size"] == [32, 32, 32, 32]
    assert all(np.isnan(history.history["noise_scale"]))
    assert history.plan.reasons["batch_growth"].code == "growth.in_run"
    assert len(history.epoch) == 4


def check_a_run_too_short_to_repay_a_compile_measures_nothing(monkeypatch):
    """Where even a free doubling (half the rest of the run saved) would
    not repay two compiles, no gradient is taken: the run costs what
    `model.fit` costs."""
    from kerascale.apply import gradient_noise

    taken = []
    real = gradient_noise.sample
    monkeypatch.setattr(
        gradient_noise, "sample", lambda *a, **k: taken.append(1) or real(*a, **k)
    )
    monkeypatch.setattr(batch_growth.EpochTimes, "switch_seconds", lambda self: 1e6)
    x, y = data(samples=2048)
    fixed = {"epochs": 5, "verbose": 0, "precision": "float32", **ONE}
    history = kerascale.fit(model(), x, y, **fixed)
    assert history.plan.reasons["batch_growth"].code == "growth.in_run"
    assert taken == [] and history.history["batch_size"] == [32] * 5
    monkeypatch.setattr(batch_growth.EpochTimes, "switch_seconds", lambda self: 0.0)
    kerascale.fit(model(), x, y, **fixed)
    assert taken  # the same run, compiles free: measured


class Breaks(Scripted):
    """Fails when asked at `epoch`: a lever's own fault."""

    def __init__(self, script, epoch):
        super().__init__(script)
        self.breaks_at = epoch

    def propose(self, epoch, logs):
        if epoch == self.breaks_at:
            raise ZeroDivisionError("the seam: a lever's bug")
        return super().propose(epoch, logs)


def check_a_lever_that_fails_is_dropped_and_the_run_goes_on():
    """A lever's own error ends no run: one warning, the lever is asked no
    more but still finishes, and followers end as the run began."""
    import warnings

    x, y = data()
    lever, told = Breaks({0: 64}, epoch=2), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history, _ = controlled_fit(model(), x, y, [], [lever], told=told, epochs=5)
    said = [str(w.message) for w in caught if w.category is KerascaleWarning]
    assert len(said) == 1 and "ZeroDivisionError" in said[0]
    assert history.epoch == [0, 1, 2, 3, 4]
    assert lever.asked == [0, 1] and lever.finished == 1
    assert told == [64, 32]  # the change, then the run's first batch at its end


class Owns(Scripted):
    """Proposes a setting of its own (not a `fit` argument, as a model's
    steps per call) at the epochs of `script`, and notes what it was told."""

    own = ("setting",)

    def __init__(self, script):
        super().__init__(script)
        self.changes, self.undone_with = [], []

    def propose(self, epoch, logs):
        self.asked.append(epoch)
        value = self.script.get(epoch)
        return None if value is None else {"setting": value}

    def changed(self, arguments):
        self.changes.append(arguments["setting"])

    def undone(self, arguments, error):
        self.undone_with.append(arguments["setting"])
        return f"setting {arguments['setting']} undone"


def check_two_levers_change_one_segment():
    """Two levers asking at one epoch's end start one new segment with both
    changes; a lever's own setting never reaches `fit` (which would raise a
    TypeError on it); a first step that fails undoes both, one warning
    each."""
    import warnings

    x, y = data()
    seen, batch, own = Recorder(), Scripted({0: 64, 2: 128}), Owns({0: 7, 2: 9})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history, controller = controlled_fit(
            model(), x, y, [seen], [batch, own], [FailsAtBatch(2)], epochs=4
        )
    said = [str(w.message) for w in caught if w.category is KerascaleWarning]
    assert said == ["setting 9 undone", said[1]] and "128" in said[1]
    assert own.changes == [7, 9] and own.undone_with == [9]
    # One restart at epoch 1 (both changes), one at 3 that failed and ran
    # again as it was.
    assert seen.epochs == [0, 1, 2, 3, 3]
    assert seen.steps == [8, 4, 4, 2, 4]
    assert controller.changes == [(1, {"batch_size": 64, "setting": 7})]
    assert history.epoch == [0, 1, 2, 3]


def check_segments_train_one_fit_s_weights():
    """A run cut at every epoch's end trains the weights of one `fit` on
    shuffled arrays: each segment goes on with the epochs' order (on Keras
    3.16 its data adapter's epoch counter, which a new `fit` starts over)."""
    x, y = data()
    plain = model()
    keras.utils.set_random_seed(1)
    plain.fit(x, y, batch_size=32, epochs=4, shuffle=True, verbose=0)
    ours = model()
    keras.utils.set_random_seed(1)
    lever = Owns({0: 1, 1: 2, 2: 3})
    _, controller = controlled_fit(ours, x, y, [], [lever], epochs=4)
    assert [start for start, _ in controller.changes] == [1, 2, 3]
    for p, q in zip(plain.get_weights(), ours.get_weights(), strict=True):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(q))


def by_batch(monkeypatch, script):
    """`goodput.grow` answers by the batch the run is at (`script`: batch ->
    the next) and "stay" at any other: the same decisions in a resumed run
    as in an uninterrupted one."""

    def grow(current, base, noise, step_seconds, **kwargs):
        return goodput.Growth(script.get(current, current), noise or 0.0, {}, None, 1.0)

    monkeypatch.setattr(goodput, "grow", grow)
    monkeypatch.setattr(batch_growth, "TIMED_STEPS", 1)


class StopAfter(keras.callbacks.Callback):
    """Raises at `epoch`'s end (before the backup's save there): a run that
    ends as an interrupted cell, with no batch hook (which keeps the batch)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")


def check_a_resume_goes_on_at_the_grown_batch(monkeypatch, tmp_path, capsys):
    """A run that grew 32 -> 64 at epoch 2 is stopped at epoch 3's end, where
    its newest checkpoint is of epoch 3's step 24 (every 8 steps; the save
    at an epoch's last step waits for its end); its rerun resumes there at
    64 with the rate x sqrt(2) (the checkpoint's), ends with the
    uninterrupted run's weights and History, and gives the rate back."""
    by_batch(monkeypatch, {32: 64})
    run = checkpointed_run
    straight, expected = run(tmp_path / "straight")
    assert expected.history["batch_size"] == [32, 32, 64, 64, 64]
    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path / "run", StopAfter(3))
    (saved,) = list(store.verified(store.scan(str(tmp_path / "run"))))[:1]
    assert (saved[1]["epoch"], saved[1]["step"]) == (3, 24), saved[1]
    assert saved[1]["levers"]["batch"]["batch"] == 64
    m, history = run(tmp_path / "run", say=True)
    said = capsys.readouterr().out
    assert "the batch resumes at 64, the checkpoint's (grown from 32" in said
    assert "(x1.41 of yours)" in said
    assert history.epoch == [0, 1, 2, 3, 4]
    assert history.history["batch_size"] == [32, 32, 64, 64, 64], history.history
    _same(m, straight)
    # Again, with a callback that acts per batch (a no-op here), which keeps
    # a batch from growing: the resume still goes on at the checkpoint's.
    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path / "again", StopAfter(3))
    with pytest.warns(KerascaleWarning, match="Resuming at batch 64") as said:
        m, history = run(tmp_path / "again", PerBatch())
    assert "PerBatch acts per batch" in str(said[0].message)
    assert history.history["batch_size"] == [32, 32, 64, 64, 64]
    _same(m, straight)


def _same(m, straight):
    """`m` trained `straight`'s weights, and has your rate back."""
    for a, b in zip(m.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    rate = float(keras.ops.convert_to_numpy(m.optimizer.learning_rate))
    np.testing.assert_allclose(rate, 1e-3, rtol=1e-6)


class PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


def checkpointed_run(directory, *callbacks, samples=2048, epochs=5, freq=8, say=False):
    """`kerascale.fit` of `model()` with `checkpoint_dir=directory`, saving
    every `freq` steps (`say`: with what kerascale prints, but no progress
    bar): (the model, its History)."""
    x, y = data(samples=samples)
    m = model()
    history = kerascale.fit(
        m,
        x,
        y,
        epochs=epochs,
        verbose=2 if say else 0,
        precision="float32",
        steps_per_execution=1,
        checkpoint_dir=str(directory),
        checkpoint_freq=freq,
        callbacks=list(callbacks),
        **ONE,
    )
    return m, history


def grown_run(directory):
    """The run of the SIGKILL check (its child's, and the uninterrupted one
    beside it): (weights, the batch of each epoch, the rate after)."""
    m, history = checkpointed_run(directory, samples=4096, epochs=6, freq=32)
    rate = float(keras.ops.convert_to_numpy(m.optimizer.learning_rate))
    return m.get_weights(), history.history["batch_size"], rate


def _child(backend, directory, out):
    child = os.path.join(os.path.dirname(__file__), "growth_child.py")
    command = [sys.executable, child, backend, str(directory), str(out)]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def _newest_meta(directory):
    """The newest checkpoint's metadata, or None (also while the child
    writes or prunes one under the scan)."""
    try:
        found = list(store.verified(store.scan(str(directory))))
    except (OSError, ValueError):
        return None
    return found[0][1] if found else None


def check_a_sigkill_resumes_at_the_grown_batch(monkeypatch, tmp_path, backend):
    """A real SIGKILL of a run (a child process) that grew 32 -> 64, once a
    checkpoint of a step at 64 is published; the rerun (another) resumes
    there and ends with the weights, batches and learning rate (yours) of
    the uninterrupted run. Both of those run in this process: the same
    code as the child's, two starts less."""
    by_batch(monkeypatch, {32: 64})
    weights, batches, rate = grown_run(tmp_path / "straight")
    proc = _child(backend, tmp_path / "run", tmp_path / "killed.npz")
    deadline = time.monotonic() + 300
    try:
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            meta = _newest_meta(tmp_path / "run")
            if meta and meta["levers"]["batch"]["batch"] == 64 and meta["step"]:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = _newest_meta(tmp_path / "run")
    assert meta["levers"]["batch"]["batch"] == 64 and meta["epoch"] >= 2
    resumed, resumed_batches, resumed_rate = grown_run(tmp_path / "run")
    assert resumed_batches == batches == [32, 32, 64, 64, 64, 64]
    np.testing.assert_allclose(resumed_rate, rate, rtol=1e-6)
    np.testing.assert_allclose(rate, 1e-3, rtol=1e-6)
    for a, b in zip(resumed, weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def check_two_devices_grow_as_one(monkeypatch):
    x, y = data(samples=2048)
    by_batch(monkeypatch, {64: 128})
    grown = model()
    history = kerascale.fit(
        grown,
        x,
        y,
        epochs=5,
        shuffle=False,
        verbose=0,
        precision="float32",
        steps_per_execution=1,
        strategy="data_parallel",
    )
    assert history.plan.replicas == 2
    assert history.plan.reasons["batch_growth"].code == "growth.in_run"
    assert history.history["batch_size"] == [64, 64, 128, 128, 128]
    rate = float(keras.ops.convert_to_numpy(grown.optimizer.learning_rate))
    np.testing.assert_allclose(rate, 1e-3, rtol=1e-6)
    by_hand = model()
    by_hand.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    by_hand.optimizer.learning_rate.assign(1e-3 * 2**0.5)
    by_hand.fit(
        x, y, batch_size=128, epochs=5, initial_epoch=2, shuffle=False, verbose=0
    )
    for a, b in zip(grown.get_weights(), by_hand.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
