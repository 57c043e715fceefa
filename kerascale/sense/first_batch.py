"""A generator's first batches, read at `kerascale.fit`'s door and by a first
attempt that fails, given back again: the elements, their order and the
generator's own side effects are Keras's, only the first comes a moment
earlier (Keras reads one too before training, to build the model).

`first_read` reads the first batch (its size and kind plan the run) and
records what training then reads, until `settle` (the first step done). A
first step that fails under kerascale's own choices is tried again plain on
`replay`, which yields what the failed attempt read before the rest: the
retry trains on the batches plain `fit` would have, from the first.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

# The record of each generator `first_read` made, keyed by that generator.
_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Record:
    """What has been read of `rest` (the user's generator) while recording."""

    def __init__(self, first: Any, rest: Any) -> None:
        self.first, self.rest = first, rest
        self.seen: list[Any] = [first]
        self.recording = True
        self.lock = threading.Lock()  # tf.data reads on its own thread
        self.generation = 0

    def yielding(self, replayed: list[Any]) -> Any:
        """A generator of `replayed`, then the rest. A generator made before
        the newest (`replay`) reads no more of the rest: what a failed
        attempt's reading thread would take after the replay began would be
        lost."""
        with self.lock:
            self.generation += 1
            generation = self.generation
        return self._yield(replayed, generation)

    def _yield(self, replayed: list[Any], generation: int) -> Any:
        yield from replayed
        while True:
            with self.lock:
                if generation != self.generation:
                    return
                try:
                    item = next(self.rest)
                except StopIteration:
                    return
                if self.recording:
                    self.seen.append(item)
            yield item


def first_read(x: Any) -> Any:
    """`x`, or for a generator one that yields the same elements, whose first
    was read here to learn its batch, recording what is read until
    `settle`."""
    if not inspect.isgenerator(x) or x in _RECORDS:
        return x
    try:
        first = next(x)
    except StopIteration:
        return x  # empty: Keras says so
    except Exception:
        return x  # the generator's own error: Keras raises it when it reads
    record = _Record(first, x)
    chained = record.yielding([first])
    _RECORDS[chained] = record
    return chained


def _record_of(x: Any) -> _Record | None:
    return _RECORDS.get(x) if inspect.isgenerator(x) else None


def first_of(x: Any) -> Any:
    """The first batch `first_read` read of `x`, or None."""
    record = _record_of(x)
    return record.first if record is not None else None


def settle(x: Any) -> None:
    """Stops recording what `x` (from `first_read`) yields: a first step is
    done, so no retry will need it again."""
    record = _record_of(x)
    if record is not None:
        with record.lock:
            record.recording = False
            record.seen = []


def replay(x: Any) -> Any:
    """For `x` from `first_read`: a generator that yields again what was
    read of it while recording, then the rest; `x` itself otherwise."""
    record = _record_of(x)
    if record is None:
        return x
    with record.lock:
        replayed = list(record.seen)
    again = record.yielding(replayed)
    _RECORDS[again] = record
    return again
