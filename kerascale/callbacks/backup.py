"""`FaultTolerantBackup`: resume after a kill or preemption at the exact batch,
with nothing applied twice and nothing lost.

The storage (publish, verify, prune) is `checkpoint_store`; the input's position
`_input_position`; when a save is due `_save_schedule`; what a checkpoint
says about the run (the configuration's and the input's fingerprints, the
random state), written at a save and verified and restored at a resume,
`_backup_meta.RunRecord`; SIGTERM, the other workers and the lease
`_coordinator`. This module is the callback, over them: when to save and
what, and the resume (which checkpoint, restoring it, and the steps of the
resumed run).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kerascale import _keras_compat as keras_compat
from kerascale import _tf
from kerascale import _validation as v
from kerascale._display import said
from kerascale._keras_compat import epoch_order
from kerascale._tf import tf
from kerascale.callbacks import _backup_meta as meta_lib
from kerascale.callbacks import _backup_state as state_lib
from kerascale.callbacks import _backup_writer as writer_lib
from kerascale.callbacks import _lease as lease_lib
from kerascale.callbacks import checkpoint_store as store
from kerascale.callbacks._base import KerascaleCallback, paused
from kerascale.callbacks._coordinator import PREEMPTED_EXIT_CODE, Coordinator
from kerascale.callbacks._input_position import (
    HostInputPosition,
    InputPosition,
    Wrapped,
)
from kerascale.callbacks._input_source import InputSource
from kerascale.callbacks._save_schedule import SaveSchedule, parse_save_freq
from kerascale.errors import CheckpointError, UnsupportedError, first_line, warn
from kerascale.sense import backend as backend_lib

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan

__all__ = ["PREEMPTED_EXIT_CODE", "FaultTolerantBackup"]

logger = logging.getLogger("kerascale")

# Background saves that fail in a row before training stops with
# CheckpointError, as a failed synchronous save stops it: by then nothing
# has protected the run for that many save intervals.
MAX_FAILED_SAVES = 3
# A save that waits this long for the one before it is said, once a run:
# training is held while it waits, and saving less often lets it go on.
SLOW_WRITE_SECONDS = 1.0


def restore_errors() -> tuple[type[BaseException], ...]:
    """What reading a checkpoint that passed its checks can still raise."""
    errors = (store.CorruptCheckpoint, ValueError, AssertionError, KeyError, OSError)
    return (*errors, tf.errors.OpError) if _tf.loaded() else errors


class FaultTolerantBackup(KerascaleCallback):
    """Checkpoints training so that rerunning the same command resumes it.

    Unlike `keras.callbacks.BackupAndRestore`, it resumes mid-epoch at the
    exact batch: the batches already applied are skipped, not repeated, so the
    resumed run makes the same optimizer updates as an uninterrupted one. A
    checkpoint holds the weights, the optimizer's state, the epoch's metrics,
    the random state and the input's position (on TensorFlow the `tf.data`
    iterator's own checkpoint; on JAX the batches read and the random state
    the epoch's shuffle drew from).

    A save copies the training state into host memory at a step's boundary
    and training goes on while one background thread writes, hashes, fsyncs
    and publishes it (`async_save`); at most one save is in flight, and a
    save that comes due while the previous one is still being written waits
    for it. Each checkpoint is committed by an atomic rename, so a kill at
    any moment, also during a background write, leaves the previous one
    intact. A background write that fails is reported as a warning at the
    next step and the next save is tried as usual; after
    `MAX_FAILED_SAVES` failures in a row, training stops with
    `CheckpointError`. When `fit` ends, the last save is published before
    it returns. A damaged latest checkpoint is reported
    and the previous one used; a directory with nothing usable left, or
    written by another configuration, raises `CheckpointError` instead of
    silently training from scratch (docs/checkpointing.md has the format).

    On SIGTERM (preemption) it saves at the next step boundary, calls the
    handler installed before it, and exits with code 143. Under a
    multi-worker strategy only the chief writes into ``directory``. When
    `fit` raises, its SIGTERM handler and its wrapper on
    `model.train_function` hand over to what was there before and take
    themselves out at their next use.

    Args:
        directory: Where checkpoints live (a local path or ``gs://...``).
            Created if missing. Must not be an existing file.
        save_freq: "epoch" (at each epoch's end), an int N (every N
            optimizer updates: every N batches, or N windows of k batches
            under gradient accumulation), or a duration like "10min", "30s" or
            "1h" (at the first update after that much time since the last
            save). Defaults to "epoch".
        keep: How many checkpoints to keep. Defaults to 2, so one damaged
            file never leaves you without a checkpoint.
        start_over: Ignore existing checkpoints and train from scratch; they
            are removed only as newer ones replace them. Defaults to False.
        verbose: 1 prints one line when resuming; 0 is silent. Defaults to 1.
        async_save: Write each checkpoint on a background thread while
            training goes on; training then waits only for the copy of the
            state into host memory, which holds one extra copy of the
            model's and optimizer's variables while a save is written.
            False writes on the training thread, which waits for the last
            byte (and stops at the first failed save). Defaults to True.

    Example:

    >>> backup = kerascale.callbacks.FaultTolerantBackup("/ckpt", save_freq=500)
    >>> model.fit(ds, epochs=10, callbacks=[backup])   # rerun to resume
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        save_freq: str | int = "epoch",
        keep: int = 2,
        *,
        start_over: bool = False,
        verbose: int = 1,
        async_save: bool = True,
    ):
        super().__init__()
        if not backend_lib.supported():
            raise UnsupportedError(
                f"FaultTolerantBackup runs on the TensorFlow and JAX backends, and "
                f"Keras runs on {backend_lib.name()!r} here. "
                "keras.callbacks.BackupAndRestore backs up at epoch ends on every "
                "backend."
            )
        self.directory = meta_lib.validate_directory(directory)
        self.save_freq = save_freq
        self._every_steps, self._every_seconds = parse_save_freq(save_freq)
        self.keep = v.positive_int("keep", keep)
        self.start_over = v.boolean("start_over", start_over)
        # How the hints name it: kerascale.fit's start_over where fit made it.
        self.start_over_words = "FaultTolerantBackup(..., start_over=True)"
        if verbose not in (0, 1) or isinstance(verbose, bool):
            raise v.fail("verbose", verbose, "0 or 1")
        self.verbose = verbose
        self.async_save = v.boolean("async_save", async_save)
        # Set by kerascale.fit: its fingerprint is checked.
        self.plan: Plan | None = None
        # Set by kerascale.fit: whether fit has steps_per_epoch (None: unknown).
        self.steps_per_epoch_given: bool | None = None
        # Set by kerascale.fit, which owns it: what the input carries across
        # epochs (None inside a plain model.fit).
        self.input_source: InputSource | None = None
        # Set by kerascale.fit: the run's levers that a checkpoint keeps, by
        # name, each a function that returns its state (`saved_levers`).
        self.levers: dict[str, Callable[[], dict[str, Any]]] = {}
        self._clock = time.monotonic  # a seam for tests
        self._lease_timeout = lease_lib.DEFAULT_TIMEOUT  # a seam for tests
        self.resumed_from: dict[str, Any] | None = None  # the restored meta.json
        self._coord = Coordinator()
        self._writer = writer_lib.Writer()
        self._wrapper: Wrapped | None = None
        self._reset_run_state()

    # --- Keras hooks ---------------------------------------------------------

    @property
    def save_every_updates(self) -> int | None:
        """The optimizer updates between saves by count (`save_freq=N`), or
        None (by epoch, or by time)."""
        return self._every_steps

    def on_train_begin(self, logs=None):
        self.start_run()
        self._reset_run_state()
        try:
            self._begin()
        except BaseException:
            self.release()  # Keras will not call on_train_end
            raise
        # A fit that raises skips on_train_end: the lease and the agreement's
        # thread are then given back within a fraction of a second.
        self.run.watch(self.release)

    def _begin(self) -> None:
        # A save another run of this process still writes (its fit raised
        # from another callback, which Keras follows with no hook) is
        # published before this run reads the directory.
        writer_lib.wait_all()
        self._s.read_run(self.model, self.params)
        self._position.super_batch = keras_compat.super_batch(self.model)
        # Keras's data adapter (its epoch counter orders the shuffle from
        # Keras 3.16): found in the Keras fit that calls this hook.
        self._fit_iterator = epoch_order.fit_epoch_iterator()
        adapter = epoch_order.adapter_of(self._fit_iterator)
        self._position.follow(adapter)
        # What the input is, before anything reads it, and the learning
        # rate before a resume restores the checkpoint's: every save records
        # them, and a resume from any point compares them.
        self._record.begin(adapter)
        # Across workers, time-based saves and preemption are agreed on.
        self._coord.start(
            self.model,
            self.run,
            self.directory,
            chief=self._s.chief,
            lease_timeout=self._lease_timeout,
            in_use=self._in_use,
        )
        existing, self._s.next_number = store.opened(
            self.directory, chief=self._s.chief
        )
        built = keras_compat.fully_built(self.model)
        if built and not self.model.optimizer.built:
            keras_compat.build_like_first_step(self.model, None)
        if not self.start_over:
            self._resume(existing, now=built)
        self._wrapper = Wrapped.install(
            self.model, self._owns, self._step_fn, self.release
        )
        self._coord.sigterm.install(self._in_use)
        self._schedule.start_clock()

    def on_epoch_begin(self, epoch, logs=None):
        keras_compat.clear_initial_epoch(self.model)  # read by Keras already
        self._s.epoch = epoch
        self._s.step = 0
        self._next_fit()
        self._position.new_epoch()
        if self._s.pending_data is not None:  # the resumed epoch: its order
            self._position.restore_order(self._s.pending_data)
        if self._s.restored_metrics and self._format != "tf":
            # Keras reset the metrics just now, and its JAX loop reads them
            # at the first step: bring back the partial epoch's values.
            self._s.restored_metrics = False
            self._read_metrics()

    def _next_fit(self) -> None:
        """A run that kerascale's levers go on in a new Keras `fit` (a new
        batch from this epoch, `apply.controller`): its epochs' steps, and
        the data adapter whose epoch counter orders the shuffle."""
        iterator = epoch_order.fit_epoch_iterator()
        if iterator is None or iterator is self._fit_iterator:
            return
        if self._fit_iterator is not None:
            self._s.epoch_steps = self.params.get("steps") or None
            self._position.follow(epoch_order.adapter_of(iterator))
        self._fit_iterator = iterator

    def on_train_batch_end(self, batch, logs=None):
        # The steps this call ran: steps_per_execution, or fewer at an
        # epoch's end.
        batch = keras_compat.last_step_of_call(self.params, batch)
        ran = batch + 1 - self._s.step
        self._s.step = batch + 1  # skipped steps count: they were applied before
        if not self._s.last_call_skipped:
            self._position.consumed += ran
            self._s.global_step += ran
        self._collect(block=False)  # a background save that ended: said now
        if self._s.last_call_skipped:
            return
        # A used-up iterator's checkpoint loses its shuffle-seed state, and
        # Keras has yet to create the next epoch's: at an epoch's last batch,
        # saves (and a preemption's exit) wait for the epoch's end.
        at_end = self._position.used_up()
        schedule = self._schedule
        # Every worker acts at the same step.
        preempt, time_due = self._coord.at_step(
            self._s.epoch, batch, time_due=schedule.time_due(), save_owed=schedule.owed
        )
        schedule.owed = schedule.owed or time_due
        due = schedule.due(self._s.global_step, self._s.k)
        if (preempt or due) and not at_end:
            # Its read-ahead reached the epoch's end (a few batches away):
            # a save now would lose the shuffle's seeds; the end's keeps them.
            at_end = self._position.seeds_lost()
        if preempt and not at_end:
            self._preempt_exit(boundary=False)
        self._s.preempt_due = self._s.preempt_due or preempt
        if due:
            if at_end:
                schedule.at_epoch_end = True
            else:
                self._save(boundary=False)

    def on_test_batch_end(self, batch, logs=None):
        # Preempted during validation: alone, exit now; across workers, the
        # next training step agrees (or the run's end does).
        if self._coord.preempted_alone() and self._s.active:
            self._preempt_exit()

    def on_epoch_end(self, epoch, logs=None):
        if self._s.epoch_complete(self._position.exhausted):
            self._s.end_epoch(epoch, logs)
        if self._s.preempt_due or self._coord.preempted_alone():
            self._preempt_exit()
        if self._schedule.by_epoch or self._schedule.at_epoch_end:
            self._save()

    def on_train_end(self, logs=None):
        try:
            # A SIGTERM after the last step (on any worker) still exits 143.
            preempted = self._coord.finish()
            # Also when the newest checkpoint holds an epoch's last batch but
            # not its end (a step save at the last batch of an input whose
            # length is unknown), so that a rerun finds the run finished.
            if self._s.global_step > self._schedule.last_step or (
                not self._schedule.at_boundary
                and self._s.epoch_complete(self._position.exhausted)
            ):
                self._save()
            # Published before fit returns; a last save that failed is an
            # error, as it is on the training thread.
            self._collect(block=True, last=True)
            meta_lib.prepend_history(self.model, self._s.history_before)
            if preempted:
                self._preempt_exit(save=False)
        finally:
            self.release()

    def _in_use(self) -> bool:
        return self._s.active and self.run.alive()

    def _owns(self, iterator: Any) -> bool:
        """Whether a step on `iterator` belongs to the `fit` it backs up."""
        return self._in_use() or (
            self._s.active and iterator is self._position.keras_iterator
        )

    def release(self) -> None:
        """Takes out the SIGTERM handler (where the main thread can) and the
        `train_function` wrapper, and the initial epoch set for a resume."""
        self._s.active = False
        self._settle()  # the save in flight, before the lease goes
        self._buffers = state_lib.HostBuffers()  # the copy's memory, given back
        self._coord.release()
        self._position.release()  # set in __init__
        wrapper, self._wrapper = self._wrapper, None
        model = getattr(self, "_model", None)
        if model is not None:
            if wrapper is not None:
                wrapper.uninstall(model)
            keras_compat.clear_initial_epoch(model)
        super().release()

    # --- saving --------------------------------------------------------------

    def _save(self, *, boundary: bool = True, wait: bool = False) -> None:
        """Saves a checkpoint: the state copied into host memory and written
        behind training (`async_save`), or written now. `boundary`: at an
        epoch's end (or after it, in validation or at the end of training),
        not between batches. `wait`: return only once it is published."""
        started = time.perf_counter()
        waited = self._collect(block=True)  # at most one save in flight
        epoch, step = self._s.at(boundary=boundary, exhausted=self._position.exhausted)
        data = self._position.record(boundary)
        state_lib.sync(self.model)
        objects = meta_lib.trackables(self.model, global_seed=None)
        meta = self._record.write(
            objects,
            workers=self._coord.workers(f"save{len(self.save_seconds)}"),
            epoch=epoch,
            step=step,
            global_step=self._s.global_step,
            epoch_steps=self._s.epoch_steps,
            epochs=self._s.epochs,
            levers={name: state() for name, state in self.levers.items()},
            data=data,
            history=self._s.history,
        )
        iterator = self._position.trackable(data)
        if iterator is not None:
            objects["iterator"] = iterator
        if self.async_save:
            # As it is now: the writer reads it after training has moved on
            # (the History, the input's record).
            meta = json.loads(json.dumps(meta))
            frozen = state_lib.snapshot(objects, self._format, self._buffers)
            self.snapshot_bytes = frozen.nbytes
            write = frozen.write
        else:
            write = state_lib.writer(objects, self._format)
        number = self._s.next_number
        commit = functools.partial(
            store.commit,
            self.directory,
            number,
            write,
            meta,
            chief=self._s.chief,
            keep=self.keep,
            spare=frozenset(self._s.damaged),
            before_commit=self._coord.check_lease,
        )
        if self._s.chief:
            self._s.next_number += 1
        self._schedule.saved(self._s.global_step, at_boundary=step == 0)
        if self.async_save:
            self._writer.start(number, commit)
        else:
            written = time.perf_counter()
            self.last_checkpoint = commit()
            self.write_seconds.append(time.perf_counter() - written)
        blocked = time.perf_counter() - started
        self.save_seconds.append(blocked)
        self.waited_seconds.append(waited)
        paused(self.model, "checkpoint", blocked)
        paused(self.model, "checkpoint_wait", waited)
        if waited > SLOW_WRITE_SECONDS and not self._said_slow:
            self._said_slow = True
            written = self.write_seconds[-1] if self.write_seconds else waited
            warn(
                f"FaultTolerantBackup: a save came due while the one before it was "
                f"still being written, and training waited {waited:.1f}s for it "
                f"(writing one took {written:.1f}s beside training). Save less "
                f"often (save_freq={self.save_freq!r} now) to keep training going."
            )
        if wait:
            self._collect(block=True, last=True)

    def _collect(self, *, block: bool, last: bool = False) -> float:
        """Takes in the background save that has ended (`block`: waits for
        the one in flight), and returns the seconds waited. A save that
        failed is said as a warning, and training goes on; an error once
        `MAX_FAILED_SAVES` failed in a row, at the `last` save (nothing
        after it would protect the run), or where the lease was lost (as on
        the training thread)."""
        started = time.perf_counter()
        outcome = self._writer.wait() if block else self._writer.finished()
        waited = time.perf_counter() - started
        if outcome is None:
            return waited
        if outcome.error is None:
            self.last_checkpoint = outcome.path
            self.write_seconds.append(outcome.seconds)
            self._failed_in_a_row = 0
            return waited
        error = outcome.error
        self.failed_saves.append(outcome.number)
        self._failed_in_a_row += 1
        if isinstance(error, CheckpointError) or not isinstance(error, Exception):
            raise error
        newest = self.last_checkpoint or "none yet"
        why = f"{type(error).__name__}: {first_line(error)}"
        if last or self._failed_in_a_row >= MAX_FAILED_SAVES:
            what = (
                "The last checkpoint"
                if self._failed_in_a_row == 1
                else f"The last {self._failed_in_a_row} checkpoints"
            )
            raise CheckpointError(
                f"{what} could not be written to {self.directory} ({why}), so "
                f"nothing protects this run since the newest checkpoint "
                f"({newest}): a kill now loses every step after it. Make the "
                "directory writable (or give another), then rerun to resume."
            ) from error
        warn(
            f"Checkpoint {store.name(outcome.number)} could not be written to "
            f"{self.directory} ({why}). Training goes on and the next save is "
            f"tried as usual; the newest checkpoint is {newest}."
        )
        return waited

    def _settle(self) -> None:
        """Waits for the save in flight where training ends otherwise than
        by `on_train_end` (fit raised, or a preemption's exit), and says a
        failure as a warning: the error on its way out is the one to see."""
        try:
            self._collect(block=True)
        except Exception as e:
            warn(f"The checkpoint being written when training ended failed: {e}")

    # --- preemption -----------------------------------------------------------

    def _preempt_exit(self, *, boundary: bool = True, save: bool = True) -> None:
        """Saves, and exits with code 143: on this worker's own SIGTERM, or
        (across workers) on another's, at the step all of them agreed on."""
        if save:
            self._save(boundary=boundary, wait=True)
        else:
            self._collect(block=True, last=True)
        own = self._coord.sigterm.requested
        self.release()
        self._coord.exit(self.last_checkpoint, own)

    # --- bookkeeping ----------------------------------------------------------

    def _reset_run_state(self) -> None:
        self._s = state_lib.RunState()
        self._fit_iterator: Any = None  # the EpochIterator of the Keras fit
        # What checkpoints say about this run (`_backup_meta`).
        self._record = meta_lib.RunRecord(self.model, self.plan, self.start_over_words)
        self._newest: dict[str, Any] | None = None  # `_newest_meta`'s
        self._schedule = SaveSchedule(
            self._every_steps, self._every_seconds, clock=self._clock
        )
        self._format = state_lib.format_name()
        position = InputPosition if self._format == "tf" else HostInputPosition
        self._position = position(
            lambda: self._s.epoch_steps, persistent=self.steps_per_epoch_given
        )
        self._position.source = self.input_source
        self.last_checkpoint: str | None = None  # the newest one published
        # Each save of this run: the seconds the training thread was held
        # (waiting for the save before it, the copy, and where saves are
        # synchronous the write), and how long it waited for the one before.
        self.save_seconds: list[float] = []
        self.waited_seconds: list[float] = []
        self.write_seconds: list[float] = []  # each published save's write
        self.failed_saves: list[int] = []  # the numbers of saves that failed
        self.snapshot_bytes = 0  # the last host copy's size, in bytes
        self._buffers = state_lib.HostBuffers()  # where the copies go
        self._failed_in_a_row = 0
        self._said_slow = False
        self.restore_seconds = 0.0  # verifying and restoring, in seconds

    # --- The resume: which checkpoint, restoring it, and the steps of the
    # resumed run (the batches a checkpoint already applied are skipped; its
    # state is restored at the first step, once the data has built the model).

    def saved_plan(self) -> Plan | None:
        """The `Plan` the newest usable checkpoint was written under, or None
        (none, `start_over`, or written by a plain `model.fit`)."""
        from kerascale.plan.plan import Plan

        meta = self._newest_meta()
        try:
            return Plan.from_dict(meta["plan"]) if meta.get("plan") else None
        except (TypeError, ValueError):
            return None

    def saved_levers(self) -> dict[str, Any]:
        """The levers' states the newest usable checkpoint was written with
        (`levers`), by name; empty where there are none."""
        levers = self._newest_meta().get("levers")
        return dict(levers) if isinstance(levers, dict) else {}

    def _newest_meta(self) -> dict[str, Any]:
        """The newest verified checkpoint's metadata ({} for none, or with
        `start_over`), read once before the run: the plan pinned at planning
        and the levers' states at the run's start come from one checkpoint.
        The run's resume (`_resume`) reads the directory itself."""
        if self._newest is None:
            found = []
            if not self.start_over:
                found = store.verified(store.scan(self.directory))
            self._newest = next((meta for _, meta in found), {})
        return self._newest

    def _resume(self, candidates: list[store.Found], *, now: bool) -> None:
        """Picks the newest usable checkpoint and restores it: `now` when the
        model is built; else its files are verified now and its state is
        restored at the first step, once the data has built the model."""
        problems: list[str] = []

        def unusable(found: store.Found, why: str, verb: str = "used") -> None:
            problems.append(f"{found.path}: {why}")
            self._s.damaged.add(found.path)
            warn(
                f"Checkpoint {found.path} cannot be {verb}: {why}. Trying the "
                "previous one."
            )

        started = time.perf_counter()
        worker = self._coord.worker_id
        for found, written in store.verified(candidates, on_damaged=unusable):
            meta = self._record.read(written, worker)
            self.restore_seconds += time.perf_counter() - started
            if not now:
                self._s.restore_pending = True
            else:
                self._record.verify(meta, found.path)
                try:
                    self._restore_state(found, meta)
                except restore_errors() as e:
                    unusable(found, first_line(e), "restored")
                    started = time.perf_counter()
                    continue
            self._resume_from(found, meta)
            return
        if problems:
            listed = "\n  ".join(problems)
            raise CheckpointError(
                f"{self.directory} holds checkpoints, but none of them can be "
                f"restored:\n  {listed}\nkerascale does not start from scratch "
                "while a checkpoint exists. Move the directory aside, or pass "
                f"{self.start_over_words} to train from scratch."
            )

    def _restore_state(self, found: store.Found, meta: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            self._record.restore(meta, store.state_prefix(found))
        except meta_lib.StateMismatch as e:
            raise store.CorruptCheckpoint(str(e)) from None
        finally:
            self.restore_seconds += time.perf_counter() - started

    def _resume_from(self, found: store.Found, meta: dict[str, Any]) -> None:
        self.resumed_from = meta
        saved = meta.get("history") or {"epoch": [], "logs": {}}
        self._s.history = json.loads(json.dumps(saved))
        self._s.history_before = json.loads(json.dumps(saved))
        self._s.global_step = self._schedule.last_step = meta["global_step"]
        self._s.epoch_steps = self._s.epoch_steps or meta["epoch_steps"]
        self._s.completed_epochs = meta["epoch"]
        self._s.restored_finished_run = (
            meta["finished"] and self._s.epochs <= meta["epochs"]
        )
        epoch = meta["epoch"]
        if self._s.restored_finished_run:
            epoch = max(epoch, self._s.epochs)
        keras_compat.set_initial_epoch(self.model, epoch, self.run.alive)
        self._s.epoch, self._s.step = epoch, meta["step"]
        self._schedule.at_boundary = meta["step"] == 0
        self._s.skip_calls = meta["step"] // self._s.spe
        self._s.pending_data = meta["data"]
        self._s.restored_metrics = meta["step"] > 0
        if not self._s.restored_finished_run and self._record.check_input(
            meta, found.path
        ):
            self._position.input_said = True  # the last-batch check adds nothing
        where = f"epoch {meta['epoch'] + 1}" + (
            f", step {meta['step']}" if meta["step"] else ""
        )
        if self._s.restored_finished_run:
            message = (
                f"Training already finished in {found.path} ({meta['epochs']} "
                f"epochs): weights restored, nothing left to train. Pass "
                f"{self.start_over_words} to train again."
            )
        else:
            done = meta["global_step"]
            message = f"Resuming from {found.path} at {where} ({done} steps done)."
        logger.info(message)
        if self.verbose:
            print(said(f"kerascale: {message}"), flush=True)

    # --- the steps of a run: skipped, counted, restored at the first -------

    def _step_fn(self, *args):
        """One call of Keras's train function: TensorFlow's takes the
        iterator, JAX's (state, iterator) and returns (logs, state)."""
        iterator = args[-1]
        if iterator is not self._position.keras_iterator:
            self._on_new_iterator(iterator)
        else:
            self._position.seen(iterator)
        live = self._position.live
        if self._s.skip_calls > 0:
            self._s.skip_calls -= 1
            self._s.last_call_skipped = True
            return state_lib.skipped_step(self.model, *args[:-1])
        self._s.last_call_skipped = False
        try:
            result = self._wrapper.real(*args[:-1], live)
        except state_lib.exhausted_errors():
            self._position.exhausted = True
            raise
        except BaseException:
            # fit ends with this error (Ctrl-C, memory): the save in flight
            # is published before it returns.
            self._settle()
            raise
        return result  # its steps are counted at the call's end

    def _on_new_iterator(self, iterator) -> None:
        first = self._position.new_iterator(iterator)
        if first:
            # Built in every run, resumed or not, so that both create their
            # variables in the same order before the state is restored.
            spec = getattr(iterator, "element_spec", None)
            keras_compat.build_like_first_step(self.model, spec)
        if self._s.restore_pending:
            self._s.restore_pending = False
            found = self._resumed_found
            self._record.verify(self.resumed_from, found.path)
            try:
                self._restore_state(found, self.resumed_from)
            except restore_errors() as e:
                raise CheckpointError(
                    f"Checkpoint {found.path} passed its checks but cannot be "
                    f"restored: {first_line(e)}. Move it aside to resume "
                    f"from the previous one, or pass {self.start_over_words}."
                ) from e
        if first and self._s.pending_data is not None:
            record, self._s.pending_data = self._s.pending_data, None
            started = time.perf_counter()
            try:
                self._position.restore(
                    iterator,
                    record,
                    store.state_prefix(self._resumed_found),
                    epochs_left=self._s.epochs > self._s.completed_epochs,
                    written_with=(self.resumed_from.get("versions") or {}).get("keras"),
                )
            finally:
                self.restore_seconds += time.perf_counter() - started
        if self._s.restored_metrics:
            self._s.restored_metrics = False
            # Keras reset the metrics at the epoch's start; bring back the
            # partial epoch's accumulated values so its logs match.
            self._read_metrics()

    def _read_metrics(self) -> None:
        state_lib.read_metrics(
            store.state_prefix(self._resumed_found),
            list(self.model.metrics_variables),
            self.resumed_from.get("state_format", "tf"),
        )

    @property
    def _resumed_found(self) -> store.Found:
        number = self.resumed_from["number"]
        return store.Found(number, f"{self.directory}/{store.name(number)}", "complete")
