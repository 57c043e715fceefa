"""Keras callbacks: each works inside a plain `model.fit` as well as through
`kerascale.fit`, which installs them from its arguments.

- `FaultTolerantBackup`: resume after a kill or preemption at the exact batch,
  with nothing applied twice and nothing lost.
- `Throughput`, `GPUMonitor`, `TimeBudget`, `ProfileWindow`: see
  `kerascale.monitoring`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import random
import signal
import tempfile
import threading
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kerascale import _validation as v
from kerascale import checkpoint as store
from kerascale.errors import CheckpointError
from kerascale.monitoring import GPUMonitor, ProfileWindow, Throughput, TimeBudget

logger = logging.getLogger("kerascale")

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "FaultTolerantBackup",
    "GPUMonitor",
    "ProfileWindow",
    "Throughput",
    "TimeBudget",
]

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect
# What reading a checkpoint that passed its checks can still raise.
_RESTORE_ERRORS = (
    store.CorruptCheckpoint,
    tf.errors.OpError,
    ValueError,
    AssertionError,
)


class FaultTolerantBackup(keras.callbacks.Callback):
    """Checkpoints training so that rerunning the same command resumes it.

    Unlike `keras.callbacks.BackupAndRestore`, it resumes mid-epoch at the
    exact batch: the batches already applied are skipped, not repeated, so the
    resumed run makes the same optimizer updates as an uninterrupted one. It
    saves the model's weights, the optimizer's state (slots, gradient
    accumulators, loss scale, iterations), the metrics of the current epoch,
    the random state (Keras seed generators, Python's and NumPy's), and the
    position of the input pipeline: a `tf.data` iterator's own checkpoint
    (shuffle buffer and seeds included) mid-epoch, or the epoch's iterator
    number at an epoch's end.

    Each checkpoint is written by TensorFlow's `tf.train.Checkpoint` into a
    directory of its own and committed by an atomic rename of its
    ``meta.json`` (sizes and SHA-256 of every file, the epoch and step, a
    fingerprint of the configuration). A kill at any moment leaves the
    previous checkpoint intact. On start, a damaged latest checkpoint is
    reported and the previous one used; a directory with nothing usable left,
    or written by another configuration, raises `CheckpointError` instead of
    silently training from scratch.

    On SIGTERM (preemption) it saves at the next step boundary, calls the
    handler that was installed before it, and exits with code 143. Under a
    multi-worker strategy only the chief writes into ``directory``.

    Args:
        directory: Where checkpoints live (a local path or ``gs://...``).
            Created if missing. Must not be an existing file.
        save_freq: "epoch" (at each epoch's end), an int N (every N
            batches), or a duration like "10min", "30s" or "1h" (at the first
            batch end after that much time since the last save). Defaults to
            "epoch".
        keep: How many checkpoints to keep. Defaults to 2, so one damaged
            file never leaves you without a checkpoint.
        start_over: Ignore existing checkpoints and train from scratch; they
            are removed only as newer ones replace them. Defaults to False.
        verbose: 1 prints one line when resuming; 0 is silent. Defaults to 1.

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
    ):
        super().__init__()
        self.directory = _validate_directory(directory)
        self.save_freq = save_freq
        self._every_steps, self._every_seconds = _validate_save_freq(save_freq)
        self.keep = v.positive_int("keep", keep)
        self.start_over = v.boolean("start_over", start_over)
        if verbose not in (0, 1) or isinstance(verbose, bool):
            raise v.fail("verbose", verbose, "0 or 1")
        self.verbose = verbose
        self.plan: Any = None  # set by kerascale.fit: its fingerprint is checked
        self._clock = time.monotonic  # a seam for tests
        self.resumed_from: dict[str, Any] | None = None  # the restored meta.json
        self._reset_run_state()

    # --- Keras hooks ---------------------------------------------------------

    def on_train_begin(self, logs=None):
        from keras.src.random import seed_generator

        self._reset_run_state()
        # Created now in every run (it draws its seed from Python's random), so
        # an uninterrupted and a resumed run consume random numbers alike.
        seed_generator.global_seed_generator()
        self._chief = _is_chief(self.model)
        self._spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        self._epochs = int(self.params.get("epochs") or 0)
        self._epoch_steps = self.params.get("steps")
        existing = (
            store.scan(self.directory) if tf.io.gfile.exists(self.directory) else []
        )
        if self._chief:
            tf.io.gfile.makedirs(self.directory)
            for path in store.remove_leftovers(self.directory):
                logger.info("Removed %s, a save that was interrupted.", path)
        self._next_number = 1 + max((f.number for f in existing), default=0)
        built = self.model.built and all(
            layer.built for layer in self.model._flatten_layers()
        )
        if built and not self.model.optimizer.built:
            with self.model.distribute_strategy.scope():
                self.model.optimizer.build(self.model.trainable_variables)
        if not self.start_over:
            self._resume([f for f in existing if f.state != "leftover"], now=built)
        self._wrap_train_function()
        self._install_sigterm_handler()
        self._last_save_time = self._clock()

    def on_epoch_begin(self, epoch, logs=None):
        self.model._initial_epoch = None  # read by Keras already; never leak
        self._epoch = epoch
        self._step = 0

    def on_train_batch_end(self, batch, logs=None):
        self._step = batch + 1  # skipped steps count: they were applied before
        if self._last_call_skipped:
            return
        # A used-up iterator's checkpoint loses its shuffle-seed state, and
        # Keras has yet to create the next epoch's: at an epoch's last batch,
        # saves (and a preemption's exit) wait for the epoch's end.
        at_end = self._used_up()
        if self._preempted and not at_end:
            self._preempt_exit(boundary=False)
        due = (
            self._every_steps is not None
            and self._global_step - self._last_save_step >= self._every_steps
        ) or (
            self._every_seconds is not None
            and self._clock() - self._last_save_time >= self._every_seconds
        )
        if due and at_end:
            self._save_due = True
        elif due:
            self._save(boundary=False)

    def on_test_batch_end(self, batch, logs=None):
        if self._preempted and self._active:  # preempted during validation
            self._preempt_exit()

    def on_epoch_end(self, epoch, logs=None):
        if self._epoch_complete():
            # Only whole epochs go into the saved History: a resumed run
            # reports the interrupted epoch itself when it completes it.
            self._history["epoch"].append(epoch)
            for key, value in (logs or {}).items():
                with contextlib.suppress(TypeError, ValueError):
                    self._history["logs"].setdefault(key, []).append(float(value))
            self._completed_epochs = epoch + 1
            if self._epoch_steps is None:
                self._epoch_steps = self._step  # learnt from a full epoch
        if self._preempted:
            self._preempt_exit()
        if self.save_freq == "epoch" or self._save_due:
            self._save()

    def on_train_end(self, logs=None):
        try:
            # Also when the newest checkpoint holds an epoch's last batch but
            # not its end (a step save at the last batch of an input whose
            # length is unknown), so that a rerun finds the run finished.
            if self._global_step > self._last_save_step or (
                not self._saved_at_boundary and self._epoch_complete()
            ):
                self._save()
            self._prepend_history()
        finally:
            self._deactivate()

    def _prepend_history(self) -> None:
        """Puts the epochs of the runs before the resume into this run's
        `History`, so `history.history["loss"]` covers the whole training."""
        history = getattr(self.model, "history", None)
        before = self._history_before
        if not isinstance(history, keras.callbacks.History) or not before["epoch"]:
            return
        history.epoch = list(before["epoch"]) + list(history.epoch)
        for key, values in before["logs"].items():
            history.history[key] = list(values) + list(history.history.get(key, []))

    # --- resume --------------------------------------------------------------

    def saved_plan(self) -> Any:
        """The `Plan` the newest usable checkpoint was written under, or None
        (none, `start_over`, or written by a plain `model.fit`)."""
        from kerascale.planning import Plan

        if self.start_over:
            return None
        for found in store.scan(self.directory):
            if found.state == "leftover":
                continue
            try:
                meta = store.verify(found)
            except store.CorruptCheckpoint:
                continue
            try:
                return Plan.from_dict(meta["plan"]) if meta.get("plan") else None
            except (TypeError, ValueError):
                return None
        return None

    def _resume(self, candidates: list[store.Found], *, now: bool) -> None:
        """Picks the newest usable checkpoint and restores it: `now` when the
        model is built; else its files are verified now and its state is
        restored at the first step, once the data has built the model."""
        if not candidates:
            return
        problems = []
        for found in candidates:
            started = time.perf_counter()
            try:
                meta = store.verify(found)
            except store.CorruptCheckpoint as e:
                problems.append(str(e))
                self._damaged.add(found.path)
                logger.warning(
                    "Checkpoint %s cannot be used: %s. Trying the previous one.",
                    found.path,
                    e,
                )
                continue
            finally:
                self.restore_seconds += time.perf_counter() - started
            if not now:
                self._resume_from(found, meta)
                self._restore_pending = True
                return
            self._check_fingerprint(meta, found)
            try:
                self._restore_state(found, meta)
            except _RESTORE_ERRORS as e:
                problems.append(f"{found.path}: {e}")
                self._damaged.add(found.path)
                logger.warning(
                    "Checkpoint %s cannot be restored: %s. Trying the previous one.",
                    found.path,
                    _first_line(e),
                )
                continue
            self._resume_from(found, meta)
            return
        listed = "\n  ".join(problems)
        raise CheckpointError(
            f"{self.directory} holds checkpoints, but none of them can be "
            f"restored:\n  {listed}\nkerascale does not start from scratch "
            "while a checkpoint exists. Move the directory aside, or pass "
            "FaultTolerantBackup(..., start_over=True) to train from scratch."
        )

    def _restore_state(self, found: store.Found, meta: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            self._read_state(found, meta)
        finally:
            self.restore_seconds += time.perf_counter() - started

    def _read_state(self, found: store.Found, meta: dict[str, Any]) -> None:
        objects = self._trackables()
        objects.pop("metrics")  # restored at the first step, once built
        status = tf.train.Checkpoint(**objects).read(store.state_prefix(found))
        status.expect_partial()  # the iterator is restored at the first step
        status.assert_existing_objects_matched()
        iterations = int(self.model.optimizer.iterations.numpy())
        if iterations != meta["iterations"]:
            raise store.CorruptCheckpoint(
                f"its metadata says {meta['iterations']} optimizer iterations "
                f"but the saved state holds {iterations}"
            )
        steps = meta["epoch_steps"]
        expected = meta["epoch"] * steps + meta["step"] if steps else meta["step"]
        if (steps or meta["epoch"] == 0) and meta["global_step"] != expected:
            raise store.CorruptCheckpoint(
                f"epoch {meta['epoch']} step {meta['step']} does not agree with "
                f"{meta['global_step']} steps trained"
            )
        try:
            python_state = meta["random"]["python"]
            random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
            name, keys, pos, has_gauss, cached = meta["random"]["numpy"]
            np.random.set_state(
                (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
            )
        except (TypeError, ValueError, IndexError) as e:
            raise store.CorruptCheckpoint(
                f"its random state is malformed ({e})"
            ) from None

    def _resume_from(self, found: store.Found, meta: dict[str, Any]) -> None:
        self.resumed_from = meta
        saved = meta.get("history") or {"epoch": [], "logs": {}}
        self._history = json.loads(json.dumps(saved))
        self._history_before = json.loads(json.dumps(saved))
        self._global_step = self._last_save_step = meta["global_step"]
        self._epoch_steps = self._epoch_steps or meta["epoch_steps"]
        self._completed_epochs = meta["epoch"]
        self._restored_finished_run = (
            meta["finished"] and self._epochs <= meta["epochs"]
        )
        epoch = meta["epoch"]
        if self._restored_finished_run:
            epoch = max(epoch, self._epochs)
        self.model._initial_epoch = epoch
        self._epoch, self._step = epoch, meta["step"]
        self._saved_at_boundary = meta["step"] == 0
        self._skip_calls = meta["step"] // self._spe
        self._pending_data = meta["data"]
        self._restored_metrics = meta["step"] > 0
        where = f"epoch {meta['epoch'] + 1}" + (
            f", step {meta['step']}" if meta["step"] else ""
        )
        if self._restored_finished_run:
            message = (
                f"Training already finished in {found.path} ({meta['epochs']} "
                "epochs): weights restored, nothing left to train. Pass "
                "start_over=True to train again."
            )
        else:
            done = meta["global_step"]
            message = f"Resuming from {found.path} at {where} ({done} steps done)."
        logger.info(message)
        if self.verbose:
            print(f"kerascale: {message}", flush=True)

    def _check_fingerprint(self, meta: dict[str, Any], found: store.Found) -> None:
        saved, now = meta["fingerprint"], _fingerprint(self.model, self.plan)
        changed = []
        for key in sorted(set(saved) & set(now)):
            if saved[key] == now[key]:
                continue
            if key == "optimizer":
                changed.append(_optimizer_change(saved[key], now[key]))
            elif key in ("architecture", "variables"):
                changed.append(
                    "the model's architecture"
                    if key == "architecture"
                    else "the model's or optimizer's variables (number or shapes)"
                )
            else:
                changed.append(f"{key}: {saved[key]!r} then, {now[key]!r} now")
        if changed:
            raise CheckpointError(
                f"The checkpoint {found.path} was written by a different "
                "configuration; what changed: "
                + "; ".join(dict.fromkeys(changed))
                + ". Resume with the settings it was written with, or pass "
                "FaultTolerantBackup(..., start_over=True) (or use a new "
                "directory) to train from scratch."
            )

    # --- the train-function wrapper: data position and skipped steps -------

    def _wrap_train_function(self) -> None:
        real = self.model.train_function
        if isinstance(real, _Wrapped):
            real = real.real
        self._real_train_function = real
        self.model.train_function = _Wrapped(self, real)

    def _step_fn(self, iterator):
        if iterator is not self._keras_iterator:
            self._on_new_iterator(iterator)
        live = self._substitute if self._substitute is not None else iterator
        if self._skip_calls > 0:
            self._skip_calls -= 1
            self._last_call_skipped = True
            return self.model.get_metrics_result()
        self._last_call_skipped = False
        try:
            logs = self._real_train_function(live)
        except (tf.errors.OutOfRangeError, StopIteration):
            self._exhausted = True
            raise
        self._consumed += self._spe
        self._global_step += self._spe
        return logs

    def _on_new_iterator(self, iterator) -> None:
        first = self._keras_iterator is None
        self._keras_iterator = iterator
        self._substitute = None
        self._consumed = 0
        self._exhausted = False
        if not first and self._next_epoch_iterator is not None:
            # Created when the last epoch's end was saved: train on it.
            self._substitute, self._next_epoch_iterator = (
                self._next_epoch_iterator,
                None,
            )
        self._dataset = getattr(iterator, "_dataset", None)
        self._cardinality = (
            int(self._dataset.cardinality()) if self._dataset is not None else None
        )
        if first:
            self._build(iterator)
        if self._restore_pending:
            self._restore_pending = False
            found = self._resumed_found
            self._check_fingerprint(self.resumed_from, found)
            try:
                self._restore_state(found, self.resumed_from)
            except _RESTORE_ERRORS as e:
                raise CheckpointError(
                    f"Checkpoint {found.path} passed its checks but cannot be "
                    f"restored: {_first_line(e)}. Move it aside to resume from "
                    "the previous one, or pass start_over=True."
                ) from e
        if first and self._pending_data is not None:
            data, self._pending_data = self._pending_data, None
            self._position_data(iterator, data)
        if self._restored_metrics:
            self._restored_metrics = False
            # Keras reset the metrics at the epoch's start; bring back the
            # partial epoch's accumulated values so its logs match.
            tf.train.Checkpoint(metrics=list(self.model.metrics_variables)).read(
                store.state_prefix(self._resumed_found)
            ).expect_partial()

    def _build(self, iterator) -> None:
        """Builds what Keras would build while tracing the first step (layers,
        compiled metrics, optimizer slots), so their state can be restored
        before that step runs. Done in every run, resumed or not, so both
        create their variables in the same order."""
        model = self.model
        metrics = getattr(model, "_compile_metrics", None)
        unbuilt = not all(layer.built for layer in model._flatten_layers()) or (
            metrics is not None and not metrics.built
        )
        spec = getattr(iterator, "element_spec", None)
        if unbuilt and spec is not None:
            with model.distribute_strategy.scope():
                model._symbolic_build(data_batch=spec)
        if not model.optimizer.built:
            with model.distribute_strategy.scope():
                model.optimizer.build(model.trainable_variables)

    def _position_data(self, iterator, data: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            self._move_input(iterator, data)
        finally:
            self.restore_seconds += time.perf_counter() - started

    def _move_input(self, iterator, data: dict[str, Any]) -> None:
        mode = data["mode"]
        if mode == "none":
            if self._epochs > self._completed_epochs:
                self._warn_order_once(
                    "the run was saved after its last epoch, with no input to "
                    "continue from"
                )
            return
        if mode in ("iterator", "advance"):
            status = tf.train.Checkpoint(iterator=iterator).read(
                store.state_prefix(self._resumed_found)
            )
            status.expect_partial()
            status.assert_existing_objects_matched()
            self._consumed = int(data["consumed"])
            if mode == "advance" and self._dataset is not None:
                # The saved run created this epoch's iterator before Keras
                # created its own (then unused); create that one too, so the
                # shuffle seeds of later epochs match.
                iter(self._dataset)
            return
        consumed = int(data["consumed"])  # "replay": read and drop what was used
        for _ in range(consumed):
            next(iterator)
        self._consumed = consumed

    # --- saving --------------------------------------------------------------

    def _epoch_complete(self) -> bool:
        if self._exhausted:
            return True
        steps = self._epoch_steps
        return steps is not None and self._step >= steps

    def _data_record(self, boundary: bool) -> dict[str, Any]:
        """How to put the input back where it is now.

        Mid-epoch (and between batches, even at an epoch's last one, before
        Keras sets up the next epoch's iterator) the `tf.data` iterator's own
        checkpoint holds its position and its shuffle seeds. A used-up
        iterator's checkpoint does not keep the seed state, so at an epoch's
        end the next epoch's iterator is created here and saved unused
        ("advance"); this run then trains its next epoch on that iterator, as
        the resumed run will.
        """
        if self._keras_iterator is None:
            return {"mode": "none"}
        exhausted = self._used_up()
        savable = self._iterator_savable()
        if boundary and exhausted:
            if not savable or self._dataset is None:
                if savable:
                    self._warn_order_once(
                        f"its iterator ({type(self._keras_iterator).__name__}) "
                        "cannot be re-created at an epoch's end"
                    )
                return {"mode": "replay", "consumed": 0}
            if self._next_epoch_iterator is None:
                self._next_epoch_iterator = iter(self._dataset)
            return {"mode": "advance", "consumed": 0}
        return {"mode": "iterator" if savable else "replay", "consumed": self._consumed}

    def _used_up(self) -> bool:
        """Whether the current iterator has no batch left (when known)."""
        return self._exhausted or (
            self._cardinality is not None
            and self._cardinality >= 0
            and self._consumed >= self._cardinality
        )

    def _iterator_savable(self) -> bool:
        if self._savable is None:
            live = (
                self._substitute
                if self._substitute is not None
                else self._keras_iterator
            )
            reasons = []
            try:
                with tempfile.TemporaryDirectory(prefix="kerascale-probe-") as tmp:
                    tf.train.Checkpoint(iterator=live).write(os.path.join(tmp, "it"))
                self._savable = True
            except Exception as e:
                self._savable = False
                what = type(live).__name__
                why = (
                    "TensorFlow cannot checkpoint a tf.distribute iterator"
                    if what == "DistributedIterator"
                    else f"{type(e).__name__}: {_first_line(e)[:200]}"
                )
                reasons.append(
                    f"its iterator ({what}) cannot be checkpointed ({why}), so on "
                    "resume kerascale re-reads the interrupted epoch's input up to "
                    "its place, and later epochs may be shuffled differently"
                )
            reason = _nondeterminism(self._dataset)
            if reason:
                reasons.append(reason)
            if reasons:
                self._warn_order_once("; ".join(reasons))
        return self._savable

    def _position(self, boundary: bool) -> tuple[int, int]:
        if boundary and self._epoch_complete():
            return self._epoch + 1, 0
        return self._epoch, self._step

    def _save(self, *, boundary: bool = True) -> None:
        """Publishes a checkpoint. `boundary`: at an epoch's end (or after
        it, in validation or at the end of training), not between batches."""
        epoch, step = self._position(boundary)
        data = self._data_record(boundary)
        finished = epoch >= self._epochs and step == 0
        meta = {
            "epoch": epoch,
            "step": step,
            "global_step": self._global_step,
            "iterations": int(self.model.optimizer.iterations.numpy()),
            "epoch_steps": self._epoch_steps,
            "epochs": self._epochs,
            "finished": bool(finished),
            "data": data,
            "fingerprint": _fingerprint(self.model, self.plan),
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "history": self._history,
            "random": _random_state(),
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        }
        objects = self._trackables()
        if data["mode"] == "advance":
            objects["iterator"] = self._next_epoch_iterator
        elif data["mode"] == "iterator":
            live = (
                self._substitute
                if self._substitute is not None
                else self._keras_iterator
            )
            objects["iterator"] = live
        checkpoint = tf.train.Checkpoint(**objects)
        started = time.perf_counter()
        if self._chief:
            path = store.publish(
                self.directory, self._next_number, checkpoint.write, meta
            )
            store.prune(self.directory, self.keep, frozenset(self._damaged))
            self._next_number += 1
        else:  # every worker takes part in the write; only the chief keeps it
            with tempfile.TemporaryDirectory(prefix="kerascale-worker-") as tmp:
                path = store.publish(tmp, self._next_number, checkpoint.write, meta)
        self.save_seconds.append(time.perf_counter() - started)
        self.last_checkpoint = path
        self._last_save_step = self._global_step
        self._last_save_time = self._clock()
        self._save_due = False
        self._saved_at_boundary = step == 0

    def _trackables(self) -> dict[str, Any]:
        from keras.src.random import seed_generator

        model = self.model
        return {
            "model": list(model.variables),
            "optimizer": list(model.optimizer.variables),
            "metrics": list(model.metrics_variables),
            "seeds": [seed_generator.global_seed_generator().state],
        }

    # --- preemption -----------------------------------------------------------

    def _install_sigterm_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.info(
                "FaultTolerantBackup: not on the main thread, so SIGTERM is not "
                "caught; checkpoints follow save_freq only."
            )
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN:
            return  # the application asked to ignore SIGTERM; respect it
        self._previous_handler = previous
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._handler_installed = True

    def _on_sigterm(self, signum, frame) -> None:
        self._preempted = True
        self._signal_frame = frame

    def _preempt_exit(self, *, boundary: bool = True) -> None:
        self._save(boundary=boundary)
        previous = self._previous_handler
        self._deactivate()
        message = (
            f"Preempted (SIGTERM): saved {self.last_checkpoint}; exiting with "
            f"code {PREEMPTED_EXIT_CODE}. Rerun the same command to resume."
        )
        logger.warning(message)
        if callable(previous):
            previous(signal.SIGTERM, self._signal_frame)
        raise SystemExit(PREEMPTED_EXIT_CODE)

    def _deactivate(self) -> None:
        self._active = False
        if self._handler_installed:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._handler_installed = False
        if isinstance(self.model.train_function, _Wrapped):
            self.model.train_function = self._real_train_function
        self.model._initial_epoch = None

    # --- bookkeeping ----------------------------------------------------------

    def _reset_run_state(self) -> None:
        self._active = True
        self._global_step = 0
        self._last_save_step = 0
        self._last_save_time = 0.0
        self._epoch = 0
        self._step = 0
        self._completed_epochs = 0
        self._skip_calls = 0
        self._last_call_skipped = False
        self._saved_at_boundary = True
        self._pending_data = None
        self._restored_metrics = False
        self._restore_pending = False
        self._restored_finished_run = False
        self._history: dict[str, Any] = {"epoch": [], "logs": {}}
        self._history_before: dict[str, Any] = {"epoch": [], "logs": {}}
        self._keras_iterator = None
        self._substitute = None
        self._next_epoch_iterator = None
        self._dataset = None
        self._cardinality = None
        self._consumed = 0
        self._exhausted = False
        self._savable = None
        self._save_due = False
        self._damaged: set[str] = set()
        self._order_warned = False
        self._preempted = False
        self._signal_frame = None
        self._previous_handler = None
        self._handler_installed = False
        self._next_number = 1
        self.last_checkpoint: str | None = None
        self.save_seconds: list[float] = []  # each save of this run, in seconds
        self.restore_seconds = 0.0  # verifying and restoring, in seconds

    @property
    def _resumed_found(self) -> store.Found:
        number = self.resumed_from["number"]
        return store.Found(number, f"{self.directory}/{store.name(number)}", "complete")

    def _warn_order_once(self, reason: str) -> None:
        if not self._order_warned:
            self._order_warned = True
            logger.warning(
                "FaultTolerantBackup resumes at the exact step, but the data "
                "order after a resume may differ from an uninterrupted run: %s.",
                reason,
            )


class _Wrapped:
    """`model.train_function` while a FaultTolerantBackup is active. Keras
    looks the function up at every step, so this is how a callback takes part
    in a step without changing Keras. A wrapper left behind by a crashed `fit`
    only passes calls through."""

    def __init__(self, owner: FaultTolerantBackup, real):
        self.owner = owner
        self.real = real

    def __call__(self, iterator):
        if not self.owner._active:
            return self.real(iterator)
        return self.owner._step_fn(iterator)


def _is_chief(model: keras.Model) -> bool:
    """Whether this worker publishes checkpoints: under a multi-worker
    strategy only the chief does; the others write to a temporary directory
    that is removed (a checkpoint write may be collective)."""
    extended = model.distribute_strategy.extended
    return bool(getattr(extended, "should_checkpoint", True))


def _validate_directory(directory: Any) -> str:
    if isinstance(directory, os.PathLike):
        directory = os.fspath(directory)
    if not isinstance(directory, str) or not directory.strip():
        raise v.fail(
            "directory",
            directory,
            "a non-empty path (str or os.PathLike) to a directory",
        )
    if "://" not in directory:
        directory = os.path.abspath(os.path.expanduser(directory))
    if tf.io.gfile.exists(directory) and not tf.io.gfile.isdir(directory):
        raise v.fail("directory", directory, "a directory, not an existing file")
    return directory


def _validate_save_freq(save_freq: Any) -> tuple[int | None, float | None]:
    accepted = (
        '"epoch", a positive int (every N batches) or a duration like "10min", '
        '"30s" or "1h"'
    )
    if isinstance(save_freq, str):
        if save_freq == "epoch":
            return None, None
        seconds = v.parse_duration(save_freq)
        if seconds is None or seconds <= 0:
            raise v.fail("save_freq", save_freq, accepted)
        return None, seconds
    return v.positive_int("save_freq", save_freq, accepted=accepted), None


def _fingerprint(model: keras.Model, plan: Any) -> dict[str, Any]:
    """What must not change between a checkpoint and its resume."""
    from kerascale import batch_search, precision

    optimizer = model.optimizer
    variables = [
        (tuple(x.shape), str(x.dtype)) for x in [*model.variables, *optimizer.variables]
    ]
    try:
        arch = json.dumps(
            batch_search._canonical_names(json.loads(model.to_json())), sort_keys=True
        )
    except Exception:
        arch = type(model).__qualname__
    config = _without_names(json.loads(json.dumps(optimizer.get_config(), default=str)))
    core = precision.core_optimizer(optimizer)
    fp = {
        "architecture": hashlib.sha256(arch.encode()).hexdigest()[:16],
        "variables": hashlib.sha256(repr(variables).encode()).hexdigest()[:16],
        "optimizer": {"class": type(optimizer).__name__, "config": config},
        "accumulation_steps": int(
            getattr(core, "gradient_accumulation_steps", None) or 1
        ),
        "precision": model.dtype_policy.name,
    }
    if plan is not None:
        fp["global_batch_size"] = plan.global_batch_size
        fp["accumulation_steps"] = plan.accumulation_steps
        fp["precision"] = plan.precision
    return fp


def _without_names(config: Any) -> Any:
    """An optimizer's config without its (automatic, per-session) names."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _optimizer_change(saved: dict[str, Any], now: dict[str, Any]) -> str:
    if saved.get("class") != now.get("class"):
        return f"optimizer: {saved.get('class')} then, {now.get('class')} now"
    diffs = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            diffs.append(f"{path} {a!r} then, {b!r} now")

    walk(saved.get("config", {}), now.get("config", {}), "")
    return "optimizer settings: " + ", ".join(diffs[:4])


def _random_state() -> dict[str, Any]:
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(keys), gauss],
        "numpy": [name, np_keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def _nondeterminism(dataset: Any) -> str | None:
    """Why a tf.data pipeline's order cannot be reproduced, or None."""
    if dataset is None:
        return None
    reasons = []
    try:
        if dataset.options().deterministic is False:
            reasons.append("its options allow non-deterministic order")
    except Exception:
        pass
    from kerascale.data import stateful_reason, unseeded_shuffle

    if unseeded_shuffle(dataset):
        reasons.append("it shuffles without a seed (give shuffle() a seed)")

    reason = stateful_reason(dataset)
    if reason:
        reasons.append(reason)
    return "; ".join(reasons) or None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
