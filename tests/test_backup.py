"""FaultTolerantBackup: real kills of real training processes, damaged files,
changed configurations, and argument validation."""

import hashlib
import json
import random
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import async_saves
import backup_child
import children
import keras
import numpy as np
import pytest
import tensorflow as tf

import kerascale
from kerascale.callbacks import FaultTolerantBackup
from kerascale.callbacks import checkpoint_store as store
from kerascale.callbacks._save_schedule import SaveSchedule
from kerascale.errors import CheckpointError, ConfigurationError
from kerascale.plan.plan import Plan

# Tests marked nightly one by one: Keras's side only (CONTRIBUTING.md).
# One worker runs this module: its module-scoped fixtures or its cache
# of reference runs are made once (`--dist loadgroup`).
pytestmark = [pytest.mark.xdist_group("tests/test_backup")]

CHILD = children.TrainingChild(Path(__file__).with_name("backup_child.py"))
STEPS_PER_EPOCH = 32  # 512 samples, batch 16
EPOCHS = 5


child_cmd, run_child, run_and_kill = CHILD.command, CHILD.run, CHILD.run_and_kill
load = children.load_npz


def max_difference(a, b):
    keys = [k for k in a if k not in ("history", "plan")]
    assert sorted(keys) == sorted(k for k in b if k not in ("history", "plan"))
    return max(
        float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
        for k in keys
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted plain `model.fit`, without the backup: every run with
    it, interrupted or not, must end exactly there."""
    d = tmp_path_factory.mktemp("reference")
    run_child(d / "ckpt", d / "out.npz", "--no-backup")
    return load(d / "out.npz")


# --- real kills --------------------------------------------------------------


@pytest.mark.kill
def test_sigkill_mid_epoch_three_resumes_to_identical_weights(reference, tmp_path):
    step = random.randint(2 * STEPS_PER_EPOCH + 1, 3 * STEPS_PER_EPOCH - 2)
    rc, seen = run_and_kill(tmp_path / "ckpt", tmp_path / "out.npz", step)
    assert rc == -signal.SIGKILL and seen < EPOCHS * STEPS_PER_EPOCH
    assert not (tmp_path / "out.npz").exists()

    result = run_child(tmp_path / "ckpt", tmp_path / "out.npz")
    assert "Resuming from" in result.stdout
    resumed = load(tmp_path / "out.npz")
    assert int(resumed["iterations"]) == int(reference["iterations"]) == 160
    assert max_difference(resumed, reference) <= 1e-6
    # The resumed History covers every epoch, equal to the uninterrupted one.
    h_ref = json.loads(str(reference["history"]))
    h_res = json.loads(str(resumed["history"]))
    assert len(h_res["loss"]) == EPOCHS
    np.testing.assert_allclose(h_res["loss"], h_ref["loss"], rtol=0, atol=1e-6)


# --- in-process interruptions (as Keras's own BackupAndRestore tests) -------


def interrupted(directory, step, **kwargs):
    """backup_child's training in this process, stopped after global step
    `step` (`children.interrupted`)."""
    children.interrupted(backup_child.train, directory, step, **kwargs)


@pytest.fixture(scope="module")
def reference_here():
    """backup_child's uninterrupted plain `model.fit`, in this process."""
    return backup_child.train(None, no_backup=True)


@pytest.mark.nightly
def test_three_interruptions_in_one_run_give_the_same_result(reference_here, tmp_path):
    stops = sorted(random.sample(range(5, EPOCHS * STEPS_PER_EPOCH - 5), 3))
    for step in stops:
        interrupted(tmp_path / "ckpt", step)
    resumed = backup_child.train(tmp_path / "ckpt")
    assert int(resumed["iterations"]) == int(reference_here["iterations"])
    assert max_difference(resumed, reference_here) <= 1e-6


@pytest.mark.parametrize("freq", ["epoch", str(STEPS_PER_EPOCH)])
@pytest.mark.nightly
def test_checkpoints_at_epoch_ends_resume_exactly(reference_here, tmp_path, freq):
    """Also every 32 batches, which lands each save on an epoch's last batch
    (that save waits for the epoch's end). The saves at epoch ends change
    nothing in the uninterrupted run (it ends as a plain fit does, checked
    first): the used-up iterator's checkpoint carries the shuffle seeds of
    the epochs after it, and no iterator is created to get them."""
    ref = backup_child.train(tmp_path / "ref", save_freq=freq)
    assert max_difference(ref, reference_here) <= 1e-6
    interrupted(tmp_path / "ckpt", 75, save_freq=freq)
    meta = store.verify(store.scan(str(tmp_path / "ckpt"))[0])
    assert (meta["epoch"], meta["step"], meta["data"]["mode"]) == (2, 0, "next_epoch")
    resumed = backup_child.train(tmp_path / "ckpt", save_freq=freq)
    assert max_difference(resumed, reference_here) <= 1e-6


@pytest.mark.kill
@pytest.mark.parametrize(
    "point", ["before-state", "mid-state", "meta-temp", "after-commit"]
)
def test_kill_inside_a_save_leaves_the_previous_checkpoint(reference, tmp_path, point):
    ckpt = tmp_path / "ckpt"
    proc = subprocess.run(
        child_cmd(ckpt, tmp_path / "out.npz", "--die-in-save", f"{point}:4"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    found = store.scan(str(ckpt))
    assert found[0].number == 4
    if point == "after-commit":  # committed: the marker is only a leftover file
        assert found[0].state == "complete"
        assert store.verify(found[0])["global_step"] == 12
    else:  # never visible as a checkpoint; the previous one verifies
        assert found[0].state == "leftover"
        assert [f.state for f in found[1:]] == ["complete", "complete"]
        assert store.verify(found[1])["global_step"] == 9
    if point == "mid-state":  # the full resume, once
        result = run_child(ckpt, tmp_path / "out.npz")
        assert "Resuming from" in result.stdout and "ckpt-00000003" in result.stdout
        assert max_difference(load(tmp_path / "out.npz"), reference) <= 1e-6
        assert (
            not (ckpt / store.name(4)).exists() or store.scan(str(ckpt))[0].number > 4
        )


@pytest.mark.kill
def test_a_kill_during_a_background_write_resumes_from_the_previous(
    reference, tmp_path
):
    """The 4th save (step 12) is being written behind training when the
    process is SIGKILLed, 2 steps later: it never becomes a checkpoint, the
    3rd (step 9) verifies, and the rerun resumes from it to the
    uninterrupted run's weights."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    command = child_cmd(ckpt, out, "--die-in-save", "behind:4", "--step-sleep", "0.01")
    children.killed_in_the_4th_save(command, store, ckpt, behind=True)
    result = run_child(ckpt, out)
    assert "ckpt-00000003" in result.stdout
    assert max_difference(load(out), reference) <= 1e-6


@pytest.mark.kill
def test_sigterm_saves_exits_143_chains_the_handler_and_resumes(reference, tmp_path):
    out = tmp_path / "out.npz"
    rc, seen = run_and_kill(
        tmp_path / "ckpt", out, 70, "--sigterm-handler", sig=signal.SIGTERM
    )
    assert rc == 143
    assert Path(str(out) + ".handler").read_text() == str(int(signal.SIGTERM))
    meta = store.verify(store.scan(str(tmp_path / "ckpt"))[0])
    # Saved at the first step boundary after the signal: nothing trained is
    # lost (the step whose end saved it was not reported by the child).
    assert meta["global_step"] in (seen, seen + 1)
    result = run_child(tmp_path / "ckpt", out, "--sigterm-handler")
    assert "handler restored: user_handler" in result.stdout
    assert max_difference(load(out), reference) <= 1e-6


@pytest.mark.nightly
def test_kerascale_fit_resumes_with_the_checkpoints_plan(tmp_path):
    """The interrupted run decides first (on a CPU it may time its choices
    on the data, which leaves no trace: tests/test_cold_and_warm.py); the
    resume is pinned to the checkpoint's plan; the reference trains that
    plan's choices, given as options, so a verdict within the noise, which
    the next run would measure again, cannot differ between them."""
    interrupted(tmp_path / "ckpt", 90, via_fit=True)
    resumed = backup_child.train(tmp_path / "ckpt", via_fit=True)
    meta = store.verify(store.scan(str(tmp_path / "ckpt"))[0])
    plan = Plan.from_dict(meta["plan"])
    assert plan.global_batch_size == 16 and meta["finished"]
    options = {
        "precision": plan.precision,
        "optimize_data": plan.data_changes.optimized,
    }
    ref = backup_child.train(tmp_path / "ref", via_fit=True, fit_options=options)
    assert max_difference(resumed, ref) <= 1e-6


@pytest.mark.nightly
def test_changed_configuration_is_a_clear_error(tmp_path):
    interrupted(tmp_path / "ckpt", 40)
    for extra, named in (
        ({"lr": 0.02}, "learning_rate"),
        ({"units": 32}, "architecture"),
    ):
        with pytest.raises(CheckpointError, match=named) as raised:
            backup_child.train(tmp_path / "ckpt", **extra)
        assert "start_over=True" in str(raised.value)
    assert store.scan(str(tmp_path / "ckpt"))[0].state == "complete"


# --- in-process: damage, fallback, validation ---------------------------------


def small_model(units=4):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(units),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


def small_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 3)).astype("float32")
    return (
        tf.data.Dataset.from_tensor_slices((x, x[:, :1])).shuffle(64, seed=2).batch(8)
    )


def two_checkpoints(directory):
    """Trains 2 epochs with epoch checkpoints; returns the two, newest first."""
    small_model().fit(
        small_data(),
        epochs=2,
        verbose=0,
        callbacks=[FaultTolerantBackup(directory, verbose=0)],
    )
    found = store.scan(str(directory))
    assert [f.state for f in found] == ["complete", "complete"]
    return found


def resume(directory, epochs=2):
    model = small_model()
    backup = FaultTolerantBackup(directory, verbose=0)
    model.fit(small_data(), epochs=epochs, verbose=0, callbacks=[backup])
    return backup


def damage_truncate(found):
    data = next(p for p in Path(found.path).iterdir() if ".data-" in p.name)
    data.write_bytes(data.read_bytes()[:10])


def damage_empty(found):
    (Path(found.path) / "state.index").write_bytes(b"")


def damage_random_bytes(found):
    data = next(p for p in Path(found.path).iterdir() if ".data-" in p.name)
    data.write_bytes(np.random.default_rng(0).bytes(data.stat().st_size))


def damage_meta(**changes):
    def damage(found, recompute=False):
        path = Path(found.path) / store.META
        meta = json.loads(path.read_text())
        for key, value in changes.items():
            if value is KeyError:
                del meta[key]
            else:
                meta[key] = value
        if recompute:
            meta["checksum"] = store._checksum(meta)
        path.write_text(json.dumps(meta))

    return damage


DAMAGE = {
    "truncated": damage_truncate,
    "empty index": damage_empty,
    "random bytes": damage_random_bytes,
    "epoch 10**6": damage_meta(epoch=10**6),
    "epoch -3": damage_meta(epoch=-3),
    'epoch "2"': damage_meta(epoch="2"),
    "missing keys": damage_meta(step=KeyError),
    "meta deleted": lambda found: (Path(found.path) / store.META).unlink(),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, kind):
    newest, previous = two_checkpoints(tmp_path)
    DAMAGE[kind](newest)
    with pytest.warns(kerascale.KerascaleWarning) as said:
        backup = resume(tmp_path)
    assert backup.resumed_from["number"] == previous.number
    assert any(newest.path in str(w.message) for w in said)
    # Never deleted on such input; the new checkpoint rotates nothing out.
    assert Path(newest.path).exists() and Path(previous.path).exists()


@pytest.mark.parametrize(
    "kind", ["epoch 10**6", "epoch -3", 'epoch "2"', "missing keys"]
)
def test_tampered_metadata_with_a_valid_checksum_is_still_caught(tmp_path, kind):
    newest, previous = two_checkpoints(tmp_path)
    DAMAGE[kind](newest, recompute=True)
    backup = resume(tmp_path)
    assert backup.resumed_from["number"] == previous.number


def test_nothing_valid_left_raises_and_deletes_nothing(tmp_path):
    for found in two_checkpoints(tmp_path):
        damage_truncate(found)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointError, match="none of them can be restored") as info:
        resume(tmp_path)
    assert "start_over=True" in str(info.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.nightly
def test_start_over_trains_from_scratch_and_keeps_old_until_replaced(tmp_path):
    two_checkpoints(tmp_path)
    model = small_model(units=6)  # a different model: would be an error otherwise
    backup = FaultTolerantBackup(tmp_path, start_over=True, keep=2, verbose=0)
    model.fit(small_data(), epochs=1, verbose=0, callbacks=[backup])
    assert backup.resumed_from is None
    numbers = [f.number for f in store.scan(str(tmp_path))]
    assert numbers == [3, 2]  # the new one, and one older kept


@pytest.mark.nightly
def test_finished_run_is_not_trained_again(tmp_path):
    two_checkpoints(tmp_path)
    model = small_model()
    backup = FaultTolerantBackup(tmp_path, verbose=0)
    history = model.fit(small_data(), epochs=2, verbose=0, callbacks=[backup])
    assert int(model.optimizer.iterations.numpy()) == 16
    assert history.epoch == [0, 1]  # the earlier run's epochs, from the checkpoint


def test_keep_prunes_and_leftovers_are_removed(tmp_path):
    leftover = tmp_path / store.name(99)
    leftover.mkdir(parents=True)
    (leftover / store.INCOMPLETE).write_text("")
    small_model().fit(
        small_data(),
        epochs=2,
        verbose=0,
        callbacks=[FaultTolerantBackup(tmp_path, save_freq=2, keep=3, verbose=0)],
    )
    found = store.scan(str(tmp_path))
    assert not leftover.exists()
    assert [f.state for f in found] == ["complete"] * 3
    assert found[0].number == 100 + 7  # numbering continues past what existed


def test_time_based_saves_use_the_clock(tmp_path):
    backup = FaultTolerantBackup(tmp_path, save_freq="10min", verbose=0)
    now = [0.0]
    backup._clock = lambda: now[0]

    class Tick(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            now[0] += 61.0  # each step "takes" a minute

    small_model().fit(small_data(), epochs=2, verbose=0, callbacks=[Tick(), backup])
    steps = sorted(store.verify(f)["global_step"] for f in store.scan(str(tmp_path)))
    assert steps == [10, 16]  # at 10 minutes, then the end of training


def test_aip_checkpoint_dir_is_the_default_on_vertex(tmp_path, monkeypatch):
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", str(tmp_path / "vertex"))
    history = kerascale.fit(small_model(), small_data(), epochs=1, verbose=0)
    assert store.scan(str(tmp_path / "vertex"))[0].state == "complete"
    assert history.plan is not None


@pytest.mark.parametrize(
    "value", [False, True, 0, -3, 1.5, "sometimes", "10 minutes", "", None]
)
def test_save_freq_rejects(tmp_path, value):
    with pytest.raises(ConfigurationError, match="save_freq"):
        FaultTolerantBackup(tmp_path, save_freq=value)


def test_directory_and_keep_are_validated(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    for bad in ("", "  ", afile, 3, None):
        with pytest.raises(ConfigurationError, match="directory"):
            FaultTolerantBackup(bad)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ConfigurationError, match="keep"):
            FaultTolerantBackup(tmp_path, keep=bad)
    with pytest.raises(ConfigurationError, match="checkpoint_freq"):
        kerascale.fit(small_model(), small_data(), checkpoint_freq=5)


def test_accepted_save_freq(tmp_path):
    assert FaultTolerantBackup(tmp_path, save_freq=7)._every_steps == 7
    assert FaultTolerantBackup(tmp_path, save_freq="1h30min")._every_seconds == 5400
    assert FaultTolerantBackup(tmp_path, save_freq="30s")._every_seconds == 30


def test_save_schedule_saves_at_window_ends_and_after_its_time():
    """Every 2 updates of 3 batches each: at batches 6 and 12, never inside a
    window; "30s": due at the first window's end from 30 s on, once."""
    steps = SaveSchedule(every_steps=2, every_seconds=None)
    saved = []
    for batch in range(1, 14):
        if steps.due(batch, 3):
            steps.saved(batch, at_boundary=False)
            saved.append(batch)
    assert saved == [6, 12]
    assert not steps.by_epoch and SaveSchedule(None, None).by_epoch

    now = [100.0]
    timed = SaveSchedule(every_steps=None, every_seconds=30.0, clock=lambda: now[0])
    timed.start_clock()
    now[0] = 129.9
    assert not timed.time_due()
    now[0] = 130.0
    assert timed.time_due()
    timed.owed = True  # the workers agreed
    assert not timed.due(5, 2) and timed.due(6, 2)
    timed.saved(6, at_boundary=False)
    assert not timed.owed and not timed.time_due() and not timed.at_boundary


def augment(a, b):
    return a + tf.random.uniform(tf.shape(a)), b


PIPELINES = {
    "seeded": (lambda ds: ds.shuffle(64, seed=2), None),
    "unseeded shuffle": (lambda ds: ds.shuffle(64), "without a seed"),
    "random map": (
        lambda ds: ds.shuffle(64, seed=2).map(augment),
        "stateful operations",
    ),
}


@pytest.mark.parametrize("kind", sorted(PIPELINES))
@pytest.mark.nightly
def test_a_non_reproducible_data_order_is_reported_once(tmp_path, kind):
    shape, reason = PIPELINES[kind]
    model = small_model()
    tf.random.set_seed(None)  # else TF derives an unseeded shuffle's seed from it
    x = np.random.default_rng(3).normal(size=(64, 3)).astype("float32")
    ds = shape(tf.data.Dataset.from_tensor_slices((x, x[:, :1]))).batch(8)
    backup = FaultTolerantBackup(tmp_path, save_freq=3, verbose=0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model.fit(ds, epochs=2, verbose=0, callbacks=[backup])
    warned = [str(w.message) for w in said if "data order" in str(w.message)]
    if reason is None:
        assert warned == []
    else:
        assert len(warned) == 1 and reason in warned[0]


def read_ahead_data():
    """6 batches an epoch, reshuffled each epoch, and a prefetch deep enough
    to read an epoch to its end after its first batch: from then on, the
    iterator's checkpoint holds nothing of the shuffle (TensorFlow writes
    nothing of an input that ran out), seed counts included."""
    x = np.random.default_rng(3).normal(size=(96, 3)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).shuffle(96, seed=2)
    return ds.batch(16).prefetch(8)


class LetReadAhead(keras.callbacks.Callback):
    """A slow step: the prefetch's thread reaches the epoch's end behind it."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)


def resumed_read_ahead(directory):
    """The 3 epochs of `read_ahead_data` resumed from `directory`: the model,
    and what was said about the data order."""
    model = small_model()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model.fit(
            read_ahead_data(),
            epochs=3,
            verbose=0,
            callbacks=[LetReadAhead(), FaultTolerantBackup(directory, verbose=0)],
        )
    return model, [str(w.message) for w in said if "data order" in str(w.message)]


def test_a_save_where_the_read_ahead_lost_the_seeds_waits_for_the_epochs_end(
    tmp_path,
):
    """Saves due every 4 steps, at the 4th batch of 6: there the state holds
    no shuffle seeds, so each waits for its epoch's end (which keeps them),
    and a run stopped at step 11 resumes from step 6 to plain fit's weights,
    without a word. Saved where they came due (steps 4 and 8), the resume
    from step 8 shuffled the third epoch otherwise (silently, before
    `seeds_lost`)."""
    plain = small_model()
    plain.fit(read_ahead_data(), epochs=3, verbose=0)
    backup = FaultTolerantBackup(tmp_path, save_freq=4, verbose=0)
    children.interrupted(
        lambda directory, callbacks: small_model().fit(
            read_ahead_data(),
            epochs=3,
            verbose=0,
            callbacks=[LetReadAhead(), backup, *callbacks],
        ),
        tmp_path,
        11,
    )
    newest = store.verify(store.scan(str(tmp_path))[0])
    assert (newest["global_step"], newest["data"]["mode"]) == (6, "next_epoch")
    model, warned = resumed_read_ahead(tmp_path)
    assert warned == [] and int(model.optimizer.iterations) == 18
    for ours, theirs in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


def test_a_last_save_where_the_read_ahead_lost_the_seeds_warns_at_the_resume(
    tmp_path,
):
    """A run stopped at step 4 of 6 saves there as it ends (it cannot wait):
    the checkpoint says the seeds were lost, and the resume says once that
    the later epochs' order may differ, then trains to the end."""

    class StopAt4(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) >= 4:
                self.model.stop_training = True

    small_model().fit(
        read_ahead_data(),
        epochs=3,
        verbose=0,
        callbacks=[LetReadAhead(), StopAt4(), FaultTolerantBackup(tmp_path, verbose=0)],
    )
    newest = store.verify(store.scan(str(tmp_path))[0])
    assert newest["data"] == {"mode": "iterator", "consumed": 4, "seeds_lost": True}
    model, warned = resumed_read_ahead(tmp_path)
    assert len(warned) == 1 and "read-ahead" in warned[0], warned
    assert int(model.optimizer.iterations) == 18


@pytest.mark.nightly
def test_resume_inside_an_accumulation_window_with_loss_scaling(tmp_path):
    """Stopped after 6 batches with 4 per update: the accumulators hold 2
    micro-batches, and the loss scale has its own state; both come back."""

    def build():
        keras.utils.set_random_seed(4)
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)]
        )
        inner = keras.optimizers.Adam(0.01)
        model.compile(
            optimizer=keras.mixed_precision.LossScaleOptimizer(inner), loss="mse"
        )
        kerascale.accumulate(model, 4)
        return model

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                self.model.stop_training = True

    def fit(model, directory, *extra):
        backup = FaultTolerantBackup(directory, save_freq=3, verbose=0)
        model.fit(small_data(), epochs=3, verbose=0, callbacks=[backup, *extra])
        return backup

    reference = build()
    fit(reference, tmp_path / "ref")
    fit(build(), tmp_path / "run", StopAt())
    meta = store.verify(store.scan(str(tmp_path / "run"))[0])
    # One update applied (4 micro-batches), 2 micro-batches in the accumulators.
    assert (meta["epoch"], meta["step"], meta["iterations"]) == (0, 6, 1)
    resumed = build()
    backup = fit(resumed, tmp_path / "run")
    assert backup.resumed_from["global_step"] == 6
    pairs = zip(
        [*reference.variables, *reference.optimizer.variables],
        [*resumed.variables, *resumed.optimizer.variables],
        strict=True,
    )
    names = [v.path for v in resumed.optimizer.variables]
    assert any("accumulator" in n for n in names) and any("scale" in n for n in names)
    for a, b in pairs:
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_a_worker_that_is_not_the_chief_writes_nothing_lasting(tmp_path, monkeypatch):
    from kerascale.callbacks import _backup_state

    monkeypatch.setattr(_backup_state, "is_chief", lambda model: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    backup = FaultTolerantBackup(tmp_path / "ckpt", save_freq=2, verbose=0)
    small_model().fit(small_data(), epochs=1, verbose=0, callbacks=[backup])
    assert len(backup.save_seconds) == 4  # it took part in every save
    assert not (tmp_path / "ckpt").exists()
    assert list((tmp_path / "temp").iterdir()) == []


class _Unwritable:
    name = "/proc/kerascale-cannot-write-here"

    def cleanup(self):
        pass


@pytest.mark.parametrize("fails", ["copy", "read"])
@pytest.mark.nightly
def test_an_epoch_end_copy_that_fails_leaves_training_as_it_is(
    tmp_path, monkeypatch, fails
):
    """The local copy that keeps later epochs shuffled as in a plain fit is
    kerascale's own addition: when it cannot be written or read back, the
    run trains on, with one warning saying so, and saves every epoch."""
    from kerascale.callbacks import _input_position

    if fails == "copy":
        real = tempfile.TemporaryDirectory

        def directory(prefix=None, **kwargs):  # only the copy's is unwritable
            if prefix == "kerascale-next-":
                return _Unwritable()
            return real(prefix=prefix, **kwargs)

        monkeypatch.setattr(tempfile, "TemporaryDirectory", directory)
    else:

        def unreadable(iterator, prefix):
            raise tf.errors.NotFoundError(None, None, f"{prefix}: gone")

        monkeypatch.setattr(
            _input_position.InputPosition, "_read", staticmethod(unreadable)
        )
    backup = FaultTolerantBackup(tmp_path, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = small_model().fit(
            small_data(), epochs=3, verbose=0, callbacks=[backup]
        )
    said = [str(w.message) for w in caught if "shuffled unlike" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert ("could not be copied" if fails == "copy" else "put back") in said[0]
    assert len(history.history["loss"]) == 3 and len(backup.save_seconds) == 3
    assert store.verify(store.scan(str(tmp_path))[0])["finished"]


@pytest.mark.nightly
def test_the_finished_run_hint_names_what_fit_takes_and_following_it_trains(
    tmp_path, caplog
):
    """After a finished run, `kerascale.fit`'s hint names its own argument,
    and that argument trains from scratch (issue 55: the hint said
    start_over=True, which only FaultTolerantBackup took, and fit passed it
    to Keras, which raised)."""
    opts = dict(batch_size=8, precision="float32", epochs=2, verbose=0)
    kerascale.fit(small_model(), small_data(), checkpoint_dir=tmp_path, **opts)
    model = small_model()
    with caplog.at_level("INFO", logger="kerascale"):
        kerascale.fit(model, small_data(), checkpoint_dir=tmp_path, **opts)
    said = [
        r.getMessage() for r in caplog.records if "already finished" in r.getMessage()
    ]
    assert said and "kerascale.fit(..., start_over=True)" in said[0], said
    assert int(model.optimizer.iterations.numpy()) == 16  # restored, not trained
    again = small_model()
    history = kerascale.fit(
        again, small_data(), checkpoint_dir=tmp_path, start_over=True, **opts
    )
    assert history.epoch == [0, 1] and len(history.history["loss"]) == 2
    assert int(again.optimizer.iterations.numpy()) == 16  # trained anew
    assert store.verify(store.scan(str(tmp_path))[0])["finished"]


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"checkpoint_freq": "soon"}, "checkpoint_freq='soon'"),
        ({"checkpoint_freq": 0}, "checkpoint_freq=0"),
        ({"start_over": "yes"}, "start_over='yes'"),
        ({"start_over": True, "checkpoint_dir": None}, "start_over needs"),
    ],
)
@pytest.mark.nightly
def test_fits_checkpoint_arguments_are_named_as_fit_names_them(tmp_path, kwargs, named):
    """An error names the argument the user passed to `kerascale.fit`, not the
    backup's own (`save_freq`), and comes before anything is planned."""
    kwargs = {"checkpoint_dir": tmp_path, **kwargs}
    with pytest.raises(ConfigurationError) as raised:
        kerascale.fit(small_model(), small_data(), epochs=1, verbose=0, **kwargs)
    assert named in str(raised.value) and "save_freq" not in str(raised.value)


# --- saves written behind training (tests_common/async_saves.py) ------------


def test_writes_run_behind_training_one_at_a_time(tmp_path, monkeypatch):
    async_saves.check_writes_run_behind_training(tmp_path, monkeypatch)


def test_a_failed_background_write_warns_and_the_next_is_tried(tmp_path):
    async_saves.check_a_failed_write_warns_and_the_next_is_tried(tmp_path)


def test_background_writes_that_keep_failing_stop_training(tmp_path):
    async_saves.check_writes_that_keep_failing_stop_training(tmp_path)


def test_async_save_is_validated(tmp_path):
    with pytest.raises(ValueError, match="async_save"):
        FaultTolerantBackup(str(tmp_path), async_save="yes")


# --- the host copy counts where the batch search answers (issue 58) ----------


@pytest.mark.nightly
def test_state_bytes_counts_the_model_and_the_optimizers_slots():
    from kerascale.sense.model_facts import state_bytes

    def mlp(optimizer):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(optimizer, "mse")
        return model

    weights = (8 * 4 + 4) * 4
    assert state_bytes(mlp("adam")) == 3 * weights  # m and v, not built yet
    assert state_bytes(mlp("sgd")) == weights
    built = mlp("adam")
    built.fit(np.zeros((4, 8)), np.zeros((4, 4)), verbose=0)
    opt = sum(np.asarray(v).nbytes for v in built.optimizer.variables)
    assert state_bytes(built) == weights + opt
    assert state_bytes(lambda: mlp("adam")) == 0  # a builder: not known here


def test_a_search_under_a_memory_limit_counts_the_checkpoints_host_copy(
    tmp_path, monkeypatch
):
    """With saves written behind training (the default), the search's share
    of this process holds the state's copy; with synchronous saves, none."""
    from kerascale.measure import host_share
    from kerascale.sense.model_facts import state_bytes

    copies = []
    real = host_share.for_search

    def recorded(*args, **kwargs):
        share = real(*args, **kwargs)
        copies.append(share.state_copy)
        return share

    monkeypatch.setattr(host_share, "for_search", recorded)
    x = np.zeros((512, 64), "float32")
    y = np.zeros((512, 1), "float32")

    def model():
        m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256)])
        m.compile("adam", "mse")
        return m

    options = dict(memory_limit="3GiB", precision="float32", verbose=0)
    kerascale.plan(model(), x, y, checkpoint_dir=str(tmp_path / "a"), **options)
    assert copies and copies[-1] == state_bytes(model()) > 0
    share = host_share.HostShare(state_copy=copies[-1], why="x")
    assert share.held_bytes(64) == copies[-1]  # beside every step
    copies.clear()
    sync = FaultTolerantBackup(str(tmp_path / "b"), async_save=False, verbose=0)
    kerascale.plan(model(), x, y, callbacks=[sync], **options)
    assert copies and copies[-1] == 0


@pytest.mark.nightly
def test_a_run_whose_rate_a_callback_moved_resumes(tmp_path):
    import learning_rate_cases

    learning_rate_cases.check_a_run_whose_rate_a_callback_moved_resumes(tmp_path)


def test_a_checkpoint_of_an_older_kerascale_is_still_resumed():
    """kerascale 0.1.0 before "compiled" hashed the compile config into the
    architecture and kept the optimizer's learning rate in its config: its
    checkpoints compare against this run's alike, without the rate."""
    from kerascale.callbacks import _backup_meta as meta_lib
    from kerascale.sense import model_facts

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    now = meta_lib.fingerprint(model, None, start_rate=1e-3)
    old = {k: v for k, v in now.items() if k not in ("compiled", "learning_rate")}
    arch = model_facts.architecture(model, with_compile_config=True)
    old["architecture"] = hashlib.sha256(arch.encode()).hexdigest()[:16]
    old["optimizer"] = {
        **now["optimizer"],
        "config": {**now["optimizer"]["config"], "learning_rate": 5e-4},
    }
    assert old["architecture"] != now["architecture"]
    meta_lib.older_fingerprint(old, now, model)
    meta_lib.check_fingerprint(old, now, "ckpt")  # raises on a difference
    old["optimizer"]["class"] = "SGD"
    with pytest.raises(CheckpointError, match="Adam now"):
        meta_lib.check_fingerprint(old, now, "ckpt")
