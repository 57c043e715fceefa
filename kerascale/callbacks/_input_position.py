"""Where the input of the running epoch is, and how to put it back.

`FaultTolerantBackup` takes part in every training step through a wrapper on
`model.train_function` (Keras looks the function up at every step, so this
is how a callback sees the iterator without changing Keras). `InputPosition`
follows the iterators Keras creates, counts what each has given, and records
the position a checkpoint needs:

- mid-epoch (and between batches, even at an epoch's last one, before Keras
  sets up the next epoch's iterator), the `tf.data` iterator's own
  checkpoint: its position and its shuffle seeds ("iterator");
- at an epoch's end, the next epoch's iterator, created here and saved
  unused ("next_epoch"), because a used-up iterator's checkpoint does not
  keep the shuffle-seed state (TF 2.21: it restores the seeds of the first
  epochs). Creating it draws the next shuffle seed, which Keras's own next
  iterator would have drawn: so when Keras creates that one, it is put back
  to the saved iterator's state, seeds included (from a copy written with
  the save), exactly as the resumed run's first iterator is. Every epoch
  then shuffles as in a plain `fit`, saved or not;
- where the iterator cannot be checkpointed (a `tf.distribute` iterator, a
  Python generator), the number of batches to read again and drop
  ("replay"), with a warning that the order may differ.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from kerascale import _tf_compat as tfc
from kerascale._tf import tf
from kerascale.callbacks._backup_meta import (
    first_line,
    nondeterminism,
    random_state,
    restore_random_state,
)


class InputPosition:
    """The input's position in the running epoch (see the module doc).

    Args:
        warn_order: Called once with the reason when the data order after a
            resume may differ from an uninterrupted run's.
    """

    def __init__(self, warn_order: Callable[[str], None]):
        self._warn_order = warn_order
        self.keras_iterator: Any = None
        self.next_epoch_iterator: Any = None  # created for an epoch-end save
        self._rewind: tempfile.TemporaryDirectory | None = None  # its copy
        self.dataset: Any = None
        self.cardinality: int | None = None
        self.consumed = 0
        self.exhausted = False
        self._savable: bool | None = None

    @property
    def live(self) -> Any:
        """The iterator the step reads from."""
        return self.keras_iterator

    def new_epoch(self) -> None:
        """An epoch begins (nothing to note: the iterator's checkpoint keeps
        its place)."""

    def seen(self, iterator: Any) -> None:
        """The step reads the iterator it read before (nothing to note)."""

    def new_iterator(self, iterator: Any) -> bool:
        """Keras created `iterator` (a new epoch); returns whether it is the
        run's first."""
        first = self.keras_iterator is None
        self.keras_iterator = iterator
        self.consumed = 0
        self.exhausted = False
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
        return first

    def used_up(self) -> bool:
        """Whether the current iterator has no batch left (when known)."""
        return self.exhausted or (
            self.cardinality is not None
            and self.cardinality >= 0
            and self.consumed >= self.cardinality
        )

    def record(self, boundary: bool) -> dict[str, Any]:
        """How to put the input back where it is now (`meta.json`'s "data").
        `boundary`: at an epoch's end, not between batches."""
        if self.keras_iterator is None:
            return {"mode": "none"}
        savable = self.savable()
        if boundary and self.used_up():
            if not savable or self.dataset is None:
                if savable:
                    self._warn_order(
                        f"its iterator ({type(self.keras_iterator).__name__}) "
                        "cannot be re-created at an epoch's end"
                    )
                return {"mode": "replay", "consumed": 0}
            if self.next_epoch_iterator is None:  # one per epoch end
                self.next_epoch_iterator = iter(self.dataset)
                self._copy_next()
            return {"mode": "next_epoch", "consumed": 0}
        return {"mode": "iterator" if savable else "replay", "consumed": self.consumed}

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
        """The iterator a checkpoint with `record` saves, or None."""
        if record["mode"] == "next_epoch":
            return self.next_epoch_iterator
        if record["mode"] == "iterator":
            return self.live
        return None

    def savable(self) -> bool:
        """Whether the live iterator can be checkpointed (tried once)."""
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
                    if what == "DistributedIterator"
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
            if reasons:
                self._warn_order("; ".join(reasons))
        return self._savable

    def restore(
        self, iterator: Any, record: dict[str, Any], prefix: str, epochs_left: bool
    ) -> None:
        """Puts `iterator` (the run's first) where `record` says, reading the
        iterator's checkpoint under `prefix`."""
        mode = record["mode"]
        if mode == "none":
            if epochs_left:
                self._warn_order(
                    "the run was saved after its last epoch, with no input to "
                    "continue from"
                )
            return
        if mode in ("iterator", "next_epoch", "advance"):
            self._read(iterator, prefix)
            self.consumed = int(record["consumed"])
            if mode == "advance" and self.dataset is not None:
                # Written before "next_epoch" (kerascale 0.1 before 2026-11-25):
                # the saved run created one iterator more than Keras, and
                # shuffled its later epochs accordingly; so does this one.
                iter(self.dataset)
            return
        consumed = int(record["consumed"])  # "replay": read and drop what was used
        for _ in range(consumed):
            next(iterator)
        self.consumed = consumed

    @staticmethod
    def _read(iterator: Any, prefix: str) -> None:
        status = tf.train.Checkpoint(iterator=iterator).read(prefix)
        status.expect_partial()
        status.assert_existing_objects_matched()


def _checkpoint_errors() -> tuple[type[BaseException], ...]:
    """What reading or writing an iterator's checkpoint raises when it cannot
    (a function: TensorFlow is imported on first use, never at import)."""
    return (tf.errors.OpError, AssertionError, ValueError, OSError)


class HostInputPosition:
    """The input's position where Keras iterates in Python (the JAX backend:
    arrays, `PyDataset`, generators): the same interface as `InputPosition`.

    There is no iterator checkpoint. What puts the input back is the number
    of batches read from the iterator since Keras created it, and Python's and
    NumPy's random state just before its first batch (Keras shuffles arrays
    with NumPy's and a `PyDataset` with Python's random, when the iterator
    starts): on resume that state is put back and the batches read again and
    dropped, so the resumed run reads the same batches in the same order.

    Keras creates a new iterator each epoch, except with `steps_per_epoch`,
    where one iterator runs on until the data ends (`persistent`); a save at
    an epoch's end then records where that iterator is.

    Args:
        warn_order: Called once with the reason when the data order after a
            resume may differ from an uninterrupted run's.
        epoch_steps: Returns the epoch's number of steps, when known.
        persistent: Whether `fit` was given `steps_per_epoch` (None: not
            known, as inside a plain `model.fit`; taken as not given, and a
            warning is given if an iterator is seen to outlive its epoch).
    """

    def __init__(
        self,
        warn_order: Callable[[str], None],
        epoch_steps: Callable[[], int | None],
        persistent: bool | None = None,
    ):
        self._warn_order = warn_order
        self._epoch_steps = epoch_steps
        self._persistent = persistent
        self.keras_iterator: Any = None
        self.consumed = 0
        self.exhausted = False
        self._start_random: dict[str, Any] | None = None
        self._new_this_epoch = False

    @property
    def live(self) -> Any:
        return self.keras_iterator

    def new_epoch(self) -> None:
        """An epoch begins (before its first step)."""
        self._new_this_epoch = False

    def new_iterator(self, iterator: Any) -> bool:
        first = self.keras_iterator is None
        self.keras_iterator = iterator
        self.consumed = 0
        self.exhausted = False
        self._new_this_epoch = True
        self._start_random = random_state()
        return first

    def seen(self, iterator: Any) -> None:
        """The step reads `iterator`, which Keras created before this epoch."""
        if not self._new_this_epoch and self._persistent is None:
            self._persistent = True
            self._warn_order(
                "Keras kept one iterator across epochs (steps_per_epoch), and "
                "FaultTolerantBackup inside a plain model.fit cannot know that "
                "before its first epoch-end save; kerascale.fit knows it"
            )
        self._new_this_epoch = True

    def used_up(self) -> bool:
        steps = self._epoch_steps()
        return self.exhausted or (
            not self._persistent and steps is not None and self.consumed >= steps
        )

    def record(self, boundary: bool) -> dict[str, Any]:
        if self.keras_iterator is None:
            return {"mode": "none"}
        if boundary and self.used_up():
            # The next epoch's iterator is new, and starts from now's state.
            return {"mode": "replay", "consumed": 0, "random": random_state()}
        return {
            "mode": "replay",
            "consumed": self.consumed,
            "random": self._start_random,
        }

    def trackable(self, record: dict[str, Any]) -> Any:
        return None  # nothing but meta.json: the record says it all

    def close(self) -> None:
        """Nothing held between epochs."""

    def restore(
        self, iterator: Any, record: dict[str, Any], prefix: str, epochs_left: bool
    ) -> None:
        if record["mode"] == "none":
            if epochs_left:
                self._warn_order(
                    "the run was saved after its last epoch, with no input to "
                    "continue from"
                )
            return
        if record.get("random") is not None:
            restore_random_state(record["random"])
            self._start_random = record["random"]
        consumed = int(record["consumed"])
        for _ in range(consumed):
            next(iterator)
        self.consumed = consumed


class Wrapped:
    """`model.train_function` while a FaultTolerantBackup is active. Keras
    looks the function up at every step, so this is how a callback takes part
    in a step without changing Keras. Left behind by a `fit` that raised, it
    hands over to the real function and takes itself out at its next call."""

    def __init__(self, owner: Any, real):
        self.owner = owner
        self.real = real

    def __call__(self, *args):
        # TensorFlow calls it with the iterator; JAX with (state, iterator).
        owner, iterator = self.owner, args[-1]
        if owner._active and (
            iterator is owner._position.keras_iterator or owner.run.alive()
        ):
            return owner._step_fn(*args)
        owner.release()  # its fit is over: a later fit is not its business
        return self.real(*args)
