"""Reading Keras's JAX input on a thread, ahead of the step.

Its design: docs/design/modules.md, `kerascale.apply.jax.reader`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import keras

from kerascale.errors import warn

_ITEM, _END, _ERROR, _INLINE = "item", "end", "error", "inline"
DEPTH = 2  # batches read ahead, by default (Prefetch, diagnose's loader)
# Batches a reader holds beside the step's own: its queue, and the one its
# thread has read and waits to put (what the batch search counts).
HELD = DEPTH + 1
_POLL = 0.05  # seconds: how soon a stopped reader notices
JOIN_TIMEOUT = 10.0
INLINE_BELOW = 0.001  # seconds of reading a batch, on average
_JUDGE_AFTER = 8  # batches handed over before judging


class Reader:
    """Reads `source` on a thread, up to `depth` items ahead; iterate it as
    you would `source`. `close()` stops and joins the thread.

    Keras keeps its distribution per thread, and its JAX iterator lays each
    batch out by the distribution it finds: the thread reads under the
    distribution of the thread that created the reader.

    A thread is worth its handoff (a queue, a thread switch: about 0.2 ms a
    batch measured on a 2-core CPU) only where reading a batch takes longer.
    After `_JUDGE_AFTER` batches, where reading took under `INLINE_BELOW` a
    batch on average, the reader hands back what it holds, in order, then
    reads in the caller's thread (`inline`), as Keras would have."""

    def __init__(self, source: Any, depth: int, *, inline: bool = False):
        self.source = source
        self.read_seconds = 0.0  # in next(source), on the reading thread
        self.items = 0  # items handed to the consumer
        self.inline = inline  # reading in the caller's thread since `inline_at`
        self.inline_at: int | None = 0 if inline else None
        self._read = 0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()  # close: drop everything
        self._detach = threading.Event()  # inline: finish, hand over, end
        self._done = False
        self._distribution = keras.distribution.distribution()
        self._thread = threading.Thread(
            target=self._run, name="kerascale-prefetch", daemon=True
        )
        if not inline:
            self._thread.start()

    def _run(self) -> None:
        try:
            if self._distribution is not None:
                keras.distribution.set_distribution(self._distribution)
            while not self._stop.is_set() and not self._detach.is_set():
                began = time.perf_counter()
                try:
                    item = next(self.source)
                except StopIteration:
                    self._put((_END, None))
                    return
                self.read_seconds += time.perf_counter() - began
                self._read += 1
                if not self._put((_ITEM, item)):
                    return
            self._put((_INLINE, None))
        except BaseException as e:  # the step that needs the batch raises it
            self._put((_ERROR, e))

    def _put(self, entry: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    @property
    def read_count(self) -> int:
        """Batches read on the thread (handed over or not)."""
        return self._read

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self.inline:
            return next(self.source)
        fast = self._read and self.read_seconds / self._read < INLINE_BELOW
        if self.items == _JUDGE_AFTER and fast:
            self._detach.set()
        kind, value = self._queue.get()
        if kind == _ITEM:
            self.items += 1
            return value
        if kind == _INLINE:  # all the thread read is handed over: go on here
            self.inline, self.inline_at = True, self.items
            self._thread.join()
            return next(self.source)
        self._done = True
        if kind == _END:
            raise StopIteration
        raise value

    def close(self) -> None:
        """Stops reading and joins the thread (a source blocked in `next`
        is waited for up to `JOIN_TIMEOUT`, then left to its daemon thread,
        with a warning)."""
        self._stop.set()
        while True:  # free the batches held, and a reader blocked on put
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.ident is not None:
            self._thread.join(JOIN_TIMEOUT)
        if self._thread.is_alive():
            warn(
                f"Prefetch: your input did not return a batch within "
                f"{JOIN_TIMEOUT:g} s of training's end; its reading thread is "
                "left to finish on its own (a daemon thread: it does not keep "
                "the process alive)."
            )


class ReadAhead:
    """Stands for Keras's JAX train function `function`, reading its input
    on a thread (one `Reader` per iterator Keras gives it).

    Args:
        function: Keras's train function, `function(state, iterator)`.
        depth: Batches held ready.
    """

    def __init__(self, function: Any, depth: int):
        self.function = function
        self.depth = depth
        self._reader: Reader | None = None
        self._done = (0, 0.0)  # the counts of the readers closed
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        *state, iterator = args
        with self._lock:
            reader = self._reader
            if reader is None or reader.source is not iterator:
                # An input read inline once is read inline from then on.
                inline = reader is not None and reader.inline
                self._close_reader()
                reader = Reader(iterator, self.depth, inline=inline)
                self._reader = reader
        return self.function(*state, reader)

    def close(self) -> None:
        """Stops and joins the reading thread."""
        with self._lock:
            self._close_reader()

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
            items, read = self._done
            self._done = (items + reader.read_count, read + reader.read_seconds)

    def counts(self) -> tuple[int, float]:
        """(batches read on a thread, seconds reading them), over every
        reader so far."""
        items, read = self._done
        r = self._reader
        if r is None:
            return items, read
        return items + r.read_count, read + r.read_seconds
