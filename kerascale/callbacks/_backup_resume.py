"""`FaultTolerantBackup`'s resume: which checkpoint, restoring it, and the
steps of the resumed run (the batches a checkpoint already applied are
skipped; its state is restored at the first step, once the data has built
the model).

The resume half of the callback (it reads the callback's run state, `_s`);
`backup.py` is the other half: when to save, and what.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from kerascale import _keras_compat as keras_compat
from kerascale import _tf
from kerascale._tf import tf
from kerascale.callbacks import _backup_meta as meta_lib
from kerascale.callbacks import _backup_state as state_lib
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import CheckpointError, first_line, warn

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan

logger = logging.getLogger("kerascale")


def restore_errors() -> tuple[type[BaseException], ...]:
    """What reading a checkpoint that passed its checks can still raise."""
    errors = (store.CorruptCheckpoint, ValueError, AssertionError, KeyError, OSError)
    return (*errors, tf.errors.OpError) if _tf.loaded() else errors


class Resume:
    """The resume half of `FaultTolerantBackup`."""

    def saved_plan(self) -> Plan | None:
        """The `Plan` the newest usable checkpoint was written under, or None
        (none, `start_over`, or written by a plain `model.fit`)."""
        from kerascale.plan.plan import Plan

        if self.start_over:
            return None
        for _, meta in store.verified(store.scan(self.directory)):
            try:
                return Plan.from_dict(meta["plan"]) if meta.get("plan") else None
            except (TypeError, ValueError):
                return None
        return None

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
            meta = meta_lib.for_worker(written, worker)
            self.restore_seconds += time.perf_counter() - started
            if not now:
                self._s.restore_pending = True
            else:
                self._check_fingerprint(meta, found)
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
            meta_lib.read_state(self.model, store.state_prefix(found), meta)
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
            print(f"kerascale: {message}", flush=True)

    def _check_fingerprint(self, meta: dict[str, Any], found: store.Found) -> None:
        now = meta_lib.fingerprint(self.model, self.plan)
        meta_lib.check_fingerprint(
            meta["fingerprint"], now, found.path, self.start_over_words
        )

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
        self._position.consumed += self._s.spe
        self._s.global_step += self._s.spe
        return result

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
            self._check_fingerprint(self.resumed_from, found)
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
