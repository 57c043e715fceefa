"""Where the input of the running epoch is, and how to put it back.

Its design: docs/design/modules.md, `kerascale.callbacks._input_position`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kerascale import _tf_compat as tfc
from kerascale._keras_compat import adapter_reads, epoch_order, steps_in_read
from kerascale._tf import tf
from kerascale.callbacks import _input_order as order
from kerascale.callbacks._run_random import (
    nondeterminism,
    random_state,
    restore_random_state,
)
from kerascale.errors import first_line, warn

if TYPE_CHECKING:
    from kerascale.callbacks._input_source import InputSource


class _EpochPosition:
    """What both positions share: how many batches the epoch's iterator has
    given, and whether it is used up, which a `tf.data` iterator of unknown
    cardinality (Keras's own dataset for arrays) cannot tell itself.

    Keras creates a new iterator each epoch, except with `steps_per_epoch`,
    where one iterator runs on until the data ends (`persistent`).

    It warns once where the data order after a resume may differ from an
    uninterrupted run's.

    Args:
        epoch_steps: Returns the epoch's number of steps, when known.
        persistent: Whether `fit` was given `steps_per_epoch` (None: not
            known, as inside a plain `model.fit`; taken as not given, and a
            warning is given if an iterator is seen to outlive its epoch).
    """

    def __init__(
        self,
        epoch_steps: Callable[[], int | None] = lambda: None,
        persistent: bool | None = None,
    ):
        self._order_warned = False
        # The resume said the input differs (`_input_fingerprint`): the
        # last batch's check says nothing more.
        self.input_said = False
        self._epoch_steps = epoch_steps
        self._persistent = persistent
        self.keras_iterator: Any = None
        # The steps a read of Keras's iterator holds, where it stacks a
        # call's batches (`keras_compat.super_batch`); 0: one a read.
        self.super_batch = 0
        self.consumed = 0
        self.exhausted = False
        self._new_this_epoch = False
        # Python's and NumPy's random state when the iterator started.
        self._start_random: dict[str, Any] | None = None
        self.source: InputSource | None = None  # where kerascale.fit gave one
        # Keras's data adapter, whose epoch counter seeds the shuffle from
        # Keras 3.16 (`_keras_compat.epoch_order`); None where not found.
        self.adapter: Any = None
        self._start_counter: int | None = None  # when the iterator started
        # The order's state at this epoch's on_epoch_begin, before Keras's
        # adapter draws the epoch's order (an enqueuer draws it there).
        self._epoch_random: dict[str, Any] | None = None
        self._order_restored = False  # by restore_order, at the epoch's begin
        # Batches Keras's enqueuer held from before the epoch, at its begin.
        self._epoch_carried = 0

    def follow(self, adapter: Any) -> None:
        """Keras's data adapter of this `fit` (found at its start, and at the
        start of each `fit` a run goes on in), or None."""
        self.adapter = adapter

    def release(self) -> None:
        """The `fit` is over: gives back what `follow` and the epochs hold."""
        self.close()

    def close(self) -> None:
        """Drops what an epoch-end save held for the next epoch."""

    def _last_digest(self) -> str | None:
        """The digest of the last batch the step trained (the `consumed`-th
        of this iterator), where this position sees the batches."""
        return None

    def _warn_order(self, reason: str) -> None:
        if not self._order_warned:
            self._order_warned = True
            warn(
                "FaultTolerantBackup resumes at the exact step, but the data "
                f"order after a resume may differ from an uninterrupted run: {reason}."
            )

    @property
    def live(self) -> Any:
        """The iterator the step reads from."""
        return self.keras_iterator

    def new_epoch(self) -> None:
        """An epoch begins: its `on_epoch_begin`, which Keras calls before its
        data adapter's (where an enqueuer, a `PyDataset` with `workers`,
        draws the epoch's order on its own thread). The order's state is
        taken here, for an iterator this epoch starts."""
        self._new_this_epoch = False
        self._epoch_random = random_state()
        self._epoch_carried = epoch_order.carried_batches(self.adapter)

    def restore_order(self, record: dict[str, Any]) -> None:
        """Puts back the order's state that `record` (a resumed run's) holds:
        at the resumed epoch's `on_epoch_begin`, before Keras's adapter
        draws the epoch's order from it (`restore` is too late for an
        enqueuer, which draws it before the first step)."""
        if record.get("mode") == "replay":
            self._epoch_random = self._put_back_order(record) or self._epoch_random
            self._order_restored = True

    def _put_back_order(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Puts back the random state and Keras's epoch counter (on the
        adapter, where `epoch_order.counter` then reads it) that `record`
        holds; returns the random state put back, if any."""
        if record.get("random") is not None:
            restore_random_state(record["random"])
        order.restore_counter(self.adapter, record, self._warn_order)
        return record.get("random")

    def seen(self, iterator: Any) -> None:
        """The step reads `iterator`, which Keras created before this epoch
        (or earlier in it)."""
        if not self._new_this_epoch and self._persistent is None:
            self._persistent = True
            self._warn_order(
                "Keras kept one iterator across epochs (steps_per_epoch), and "
                "FaultTolerantBackup inside a plain model.fit cannot know that "
                "before its first epoch-end save; kerascale.fit knows it"
            )
        self._new_this_epoch = True

    def _started(self, iterator: Any) -> bool:
        """Keras created `iterator`; returns whether it is the run's first."""
        first = self.keras_iterator is None
        self.keras_iterator = iterator
        self.consumed = 0
        self.exhausted = False
        self._new_this_epoch = True
        # The state the iterator's order was drawn from: its epoch's begin
        # (an iterator made outside an epoch's hooks: now). The counter
        # changes only at an epoch's end.
        epoch_random, self._epoch_random = self._epoch_random, None
        self._start_random = epoch_random or random_state()
        self._start_counter = epoch_order.counter(self.adapter)
        if self.source is not None:
            self.source.new_iterator()
        return first

    def record(self, boundary: bool) -> dict[str, Any]:
        """How to put the input back where it is now (`meta.json`'s "data").
        `boundary`: at an epoch's end, not between batches."""
        if self.keras_iterator is None:
            return {"mode": "none"}
        used_up = boundary and self.used_up()
        record = self._record(used_up)
        source = self.source.record(used_up) if self.source is not None else None
        if source is not None:
            record["source"] = source
        return record

    def _record(self, used_up: bool) -> dict[str, Any]:
        """Re-read what this iterator gave, from its start's random state; or
        (`used_up`) nothing: the next iterator starts from now's."""
        if used_up:
            record = {"mode": "replay", "consumed": 0, "random": random_state()}
            counter = epoch_order.counter(self.adapter)
        else:
            record = {
                "mode": "replay",
                "consumed": self.consumed,
                "random": self._start_random,
            }
            counter = self._start_counter
            last = self._last_digest() if self.consumed else None
            if last is not None:
                record["last_batch"] = last
        if counter is not None:
            record["adapter_epoch"] = counter
        return record

    def restore(
        self,
        iterator: Any,
        record: dict[str, Any],
        prefix: str,
        epochs_left: bool,
        written_with: str | None = None,
    ) -> None:
        """Puts `iterator` (the run's first) where `record` says, reading an
        iterator's checkpoint under `prefix` where the record has one.
        `written_with`: the Keras version that wrote the checkpoint."""
        mode = record["mode"]
        if mode == "none":
            if epochs_left:
                self._warn_order(
                    "the run was saved after its last epoch, with no input to "
                    "continue from"
                )
            return
        if self.source is not None:
            self.source.restore(record.get("source"))
        if mode != "replay":
            self._restore_iterator(iterator, record, prefix)
            return
        if not self._order_restored:  # no epoch began since the resume
            self._start_random = self._put_back_order(record) or self._start_random
            self._start_counter = epoch_order.counter(self.adapter)
        consumed = int(record["consumed"])  # read again and drop what was used
        last, read = None, 0
        while read < consumed:
            last = next(iterator)
            read += steps_in_read(last, self.super_batch)
        self.consumed = consumed
        if not self.input_said:  # one warning a resume
            order.check(record, last, written_with, carried=self._epoch_carried)

    def _restore_iterator(
        self, iterator: Any, record: dict[str, Any], prefix: str
    ) -> None:
        raise ValueError(f"unknown input position mode {record['mode']!r}")

    def seeds_lost(self) -> bool:
        """Whether a save now would lose what orders the later epochs (only
        a `tf.data` iterator's checkpoint can)."""
        return False

    def used_up(self) -> bool:
        """Whether the current iterator has no batch left (when known): it
        ran out, or gave the epoch's steps of an iterator made per epoch."""
        steps = self._epoch_steps()
        return self.exhausted or (
            not self._persistent and steps is not None and self.consumed >= steps
        )


class InputPosition(_EpochPosition):
    """The input's position in the running epoch (see the module doc)."""

    def __init__(
        self,
        epoch_steps: Callable[[], int | None] = lambda: None,
        persistent: bool | None = None,
    ):
        super().__init__(epoch_steps, persistent)
        self.next_epoch_iterator: Any = None  # created for an epoch-end save
        self._rewind: tempfile.TemporaryDirectory | None = None  # its copy
        self.dataset: Any = None
        self.cardinality: int | None = None
        self._savable: bool | None = None
        self._drawers = 0  # the datasets in it that draw seeds (`seed_drawers`)
        # The live iterator's state read by `seeds_lost` (and whether it
        # keeps its seeds), at `consumed` batches.
        self._frozen: tuple[Any, bool] | None = None
        self._frozen_at = -1
        # The batches a PyDataset's adapter gave (read inside the step's
        # tf.function, where only the adapter's generator sees them).
        self._reads = order.Digests()
        self._unfollow: Callable[[], None] | None = None

    def follow(self, adapter: Any) -> None:
        unfollow, self._unfollow = self._unfollow, None
        if unfollow is not None:  # the adapter of a `fit` before
            unfollow()
        super().follow(adapter)
        self._unfollow = adapter_reads.follow(
            adapter, self._reads.restart, self._reads.add
        )

    def release(self) -> None:
        super().release()
        unfollow, self._unfollow = self._unfollow, None
        if unfollow is not None:
            unfollow()

    def _last_digest(self) -> str | None:
        # The adapter's newest generator is this iterator's: tf.data starts
        # an epoch's generator only once Keras makes the epoch's iterator.
        # Under a tf.distribute strategy the replicas' reads are not one.
        if self._unfollow is None or _distributed(self.live):
            return None
        return self._reads.digest(self.consumed)

    def new_iterator(self, iterator: Any) -> bool:
        """Keras created `iterator` (a new epoch); returns whether it is the
        run's first."""
        first = self._started(iterator)
        if not first and self._rewind is not None:
            # The last epoch's end was saved with an iterator created for
            # this epoch: Keras's own becomes that one, shuffle seeds and all.
            try:
                self._read(iterator, os.path.join(self._rewind.name, "it"))
            except _checkpoint_errors() as e:  # Keras's iterator trains as it is
                self._warn_order(
                    "the next epoch's iterator could not be put back to the saved "
                    f"one ({type(e).__name__}: {first_line(e)[:200]}), so later "
                    "epochs are shuffled unlike a plain fit's"
                )
        self.close()
        self.dataset = tfc.iterator_dataset(iterator)
        self.cardinality = (
            int(self.dataset.cardinality()) if self.dataset is not None else None
        )
        self._drawers = (
            tfc.seed_drawers(self.dataset) if self.dataset is not None else 0
        )
        self._frozen = None  # the last epoch's state, read for a deferred save
        return first

    def used_up(self) -> bool:
        return super().used_up() or (
            self.cardinality is not None
            and self.cardinality >= 0
            and self.consumed >= self.cardinality
        )

    def _record(self, used_up: bool) -> dict[str, Any]:
        savable = self.savable()
        if not savable:
            return super()._record(used_up)
        if used_up:
            if self.dataset is None:
                self._warn_order(
                    f"its iterator ({type(self.keras_iterator).__name__}) "
                    "cannot be re-created at an epoch's end"
                )
                return super()._record(used_up)
            if self.next_epoch_iterator is None:  # one per epoch end
                self.next_epoch_iterator = iter(self.dataset)
                self._copy_next()
            return {"mode": "next_epoch", "consumed": 0}
        record = {"mode": "iterator", "consumed": self.consumed}
        if self.seeds_lost():
            record["seeds_lost"] = True
        return record

    def seeds_lost(self) -> bool:
        """Whether a save now would lose the live iterator's shuffle seeds:
        where its read-ahead reached the epoch's end, TensorFlow writes
        nothing of the input that ran out, seed counts included, and a
        resume would shuffle the later epochs unlike this run. Only then
        is the state read (at a save that is due), once a step; the save
        writes the state read here."""
        if not self._drawers or self.next_epoch_iterator is not None:
            return False
        if not self.savable():  # its batches are read again instead
            return False
        if self._frozen_at != self.consumed or self._frozen is None:
            state = tfc.iterator_state(self.live)
            self._frozen = (state, tfc.keeps_seeds(state, self._drawers))
            self._frozen_at = self.consumed
        return not self._frozen[1]

    def _copy_next(self) -> None:
        """A local copy of the next epoch's iterator as created (its seed
        state included), for Keras's own next iterator to be put back to."""
        self._rewind = tempfile.TemporaryDirectory(prefix="kerascale-next-")
        try:
            tf.train.Checkpoint(iterator=self.next_epoch_iterator).write(
                os.path.join(self._rewind.name, "it")
            )
        except _checkpoint_errors() as e:  # the save itself goes on
            self.close()
            self._warn_order(
                f"the next epoch's iterator could not be copied ({type(e).__name__}: "
                f"{first_line(e)[:200]}), so later epochs are shuffled unlike a "
                "plain fit's"
            )

    def close(self) -> None:
        """Drops the iterator created for an epoch-end save, and its copy."""
        self.next_epoch_iterator = None
        rewind, self._rewind = self._rewind, None
        if rewind is not None:
            rewind.cleanup()

    def trackable(self, record: dict[str, Any]) -> Any:
        """The iterator a checkpoint with `record` saves, or None: the live
        one as `seeds_lost` read it, where it read it at this step."""
        if record["mode"] == "next_epoch":
            return self.next_epoch_iterator
        if record["mode"] != "iterator":
            return None
        frozen, self._frozen = self._frozen, None  # a shuffle buffer's copy
        if frozen is not None and self._frozen_at == self.consumed:
            return tfc.frozen(frozen[0])
        return self.live

    def savable(self) -> bool:
        """Whether the live iterator can be checkpointed (tried once). Where
        it cannot, the batches are read again (said once, unless the input
        is one that reads again exactly)."""
        if self._savable is None:
            live, reasons = self.live, []
            try:
                with tempfile.TemporaryDirectory(prefix="kerascale-probe-") as tmp:
                    tf.train.Checkpoint(iterator=live).write(os.path.join(tmp, "it"))
                self._savable = True
            except Exception as e:
                self._savable = False
                what = type(live).__name__
                why = (
                    "TensorFlow cannot checkpoint a tf.distribute iterator"
                    if _distributed(live)
                    else f"{type(e).__name__}: {first_line(e)[:200]}"
                )
                reasons.append(
                    f"its iterator ({what}) cannot be checkpointed ({why}), so on "
                    "resume kerascale re-reads the interrupted epoch's input up to "
                    "its place, and later epochs may be shuffled differently"
                )
            reason = nondeterminism(self.dataset)
            if reason:
                reasons.append(reason)
            # A PyDataset or a generator is read again exactly, where no
            # tf.distribute iterator reads it ahead on several devices.
            exact = (
                self.source is not None
                and self.source.replayable
                and not _distributed(live)
            )
            if reasons and not exact:
                self._warn_order("; ".join(reasons))
        return self._savable

    def _restore_iterator(
        self, iterator: Any, record: dict[str, Any], prefix: str
    ) -> None:
        mode = record["mode"]
        if mode not in ("iterator", "next_epoch", "advance"):
            super()._restore_iterator(iterator, record, prefix)
        self._read(iterator, prefix)
        self.consumed = int(record["consumed"])
        if record.get("seeds_lost"):
            self._warn_order(
                "it was saved near an epoch's end, where the input's read-ahead "
                "had reached it and TensorFlow's iterator checkpoint holds no "
                "shuffle seeds, so the later epochs are shuffled unlike the "
                "interrupted run's (kerascale's own saves wait for the epoch's "
                "end there; this one was a last save, at a stop or an error)"
            )
        if mode == "advance" and self.dataset is not None:
            # Written before "next_epoch" (kerascale 0.1 before 2026-11-25):
            # the saved run created one iterator more than Keras, and
            # shuffled its later epochs accordingly; so does this one.
            iter(self.dataset)

    @staticmethod
    def _read(iterator: Any, prefix: str) -> None:
        status = tf.train.Checkpoint(iterator=iterator).read(prefix)
        status.expect_partial()
        status.assert_existing_objects_matched()


def _distributed(iterator: Any) -> bool:
    """Whether `iterator` is a tf.distribute strategy's, which reads ahead
    on each replica's device (and cannot be checkpointed)."""
    return type(iterator).__name__ == "DistributedIterator"


def _checkpoint_errors() -> tuple[type[BaseException], ...]:
    """What reading or writing an iterator's checkpoint raises when it cannot
    (a function: TensorFlow is imported on first use, never at import)."""
    return (tf.errors.OpError, AssertionError, ValueError, OSError)


class HostInputPosition(_EpochPosition):
    """The input's position where Keras iterates in Python (the JAX backend:
    arrays, `PyDataset`, generators): the same interface as `InputPosition`.

    There is no iterator checkpoint. What puts the input back is the number
    of batches read from the iterator since Keras created it, and Python's and
    NumPy's random state just before its first batch (Keras shuffles arrays
    with NumPy's and a `PyDataset` with Python's random, when the iterator
    starts): on resume that state is put back and the batches read again and
    dropped, so the resumed run reads the same batches in the same order.
    With `steps_per_epoch`, a save at an epoch's end records where the one
    iterator Keras keeps across epochs is.
    """

    _peek: order.Peek | None = None

    def new_iterator(self, iterator: Any) -> bool:
        self._peek = order.Peek(iterator, self.super_batch)
        return self._started(iterator)

    def _last_digest(self) -> str | None:
        return self._peek.digests.digest(self.consumed) if self._peek else None

    @property
    def live(self) -> Any:
        """Keras's iterator, through `order.Peek`: the batches a step read
        are what a save records the order by."""
        return self._peek if self._peek is not None else self.keras_iterator

    def trackable(self, record: dict[str, Any]) -> Any:
        return None  # nothing but meta.json: the record says it all


class Wrapped:
    """`model.train_function` while a FaultTolerantBackup is active. Keras
    looks the function up at every step, so this is how a callback takes part
    in a step without changing Keras. Left behind by a `fit` that raised, it
    hands over to the real function and takes itself out at its next call.

    Args:
        real: Keras's train function.
        owns: Whether a step on this iterator belongs to the backup's `fit`.
        step: The backup's step, called instead of `real` while it owns them.
        release: Ends the backup's part, at the first step it does not own.
    """

    def __init__(
        self,
        real: Callable[..., Any],
        owns: Callable[[Any], bool],
        step: Callable[..., Any],
        release: Callable[[], None],
    ):
        self.real = real
        self._owns, self._step, self._release = owns, step, release

    def __call__(self, *args):
        # TensorFlow calls it with the iterator; JAX with (state, iterator).
        if self._owns(args[-1]):
            return self._step(*args)
        self._release()  # its fit is over: a later fit is not its business
        return self.real(*args)

    @classmethod
    def install(
        cls,
        model: Any,
        owns: Callable[[Any], bool],
        step: Callable[..., Any],
        release: Callable[[], None],
    ) -> Wrapped:
        """Wraps `model.train_function` (the real one, if already wrapped)."""
        real = model.train_function
        real = real.real if isinstance(real, Wrapped) else real
        wrapper = cls(real, owns, step, release)
        model.train_function = wrapper
        return wrapper

    def uninstall(self, model: Any) -> None:
        """Puts the real function back, if this wrapper is still there."""
        if model.train_function is self:
            model.train_function = self.real
