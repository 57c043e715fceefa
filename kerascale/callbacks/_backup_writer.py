"""The backup's writer: one thread writes, hashes, fsyncs and publishes a
checkpoint behind training, at most one at a time.

Its design: docs/design/modules.md, `kerascale.callbacks._backup_writer`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Callable

# The writer's thread runs at this niceness (Linux schedules threads by it):
# where training keeps every core busy, it yields to training, and a write
# takes longer but still less than the seconds between saves.
NICENESS = int(os.environ.get("KERASCALE_WRITER_NICENESS", "10"))

# Every writer with a save in flight, for `wait_all`.
_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one save ended.

    Attributes:
        number: The checkpoint's number.
        path: Where it was published, or None where it failed.
        error: Why it failed, or None.
        seconds: The write's own time (serialise, write, hash, fsync,
            publish), in seconds.
    """

    number: int
    path: str | None
    error: BaseException | None
    seconds: float


class Writer:
    """Runs each save's write on a thread of its own, one at a time.

    The thread is not a daemon: a process that ends while a save is being
    written waits for it (Python joins such threads at its exit), so a script
    that returns right after `fit` still publishes its last checkpoint. A
    kill loses the save in flight only: the previous checkpoint is intact
    (publishing is an atomic rename).
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._outcome: Outcome | None = None
        # One collector at a time: a fit that raised is settled by the
        # run's watcher thread while the next run may begin on the main one.
        self._collecting = threading.Lock()

    @property
    def busy(self) -> bool:
        """Whether a save is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, number: int, write: Callable[[], str]) -> None:
        """Starts writing checkpoint `number`: `write()` returns where it was
        published. The save before it must have been collected (`wait`)."""
        if self._thread is not None:
            raise RuntimeError("a save is still in flight: wait() for it first")

        def run() -> None:
            _lower_priority()
            started = time.perf_counter()
            try:
                path, error = write(), None
            except BaseException as e:  # delivered to the training thread
                path, error = None, e
            self._outcome = Outcome(number, path, error, time.perf_counter() - started)

        self._thread = threading.Thread(
            target=run, name=f"kerascale-backup-writer-{number}", daemon=False
        )
        self._thread.start()
        _WRITERS.add(self)

    def finished(self) -> Outcome | None:
        """The outcome of the save in flight if it has ended (collected
        once), else None; never waits."""
        if self._thread is None or self._thread.is_alive():
            return None
        return self.wait()

    def wait(self) -> Outcome | None:
        """Waits for the save in flight and returns its outcome (collected
        once), or None where none was started since the last collection.
        The thread stays this writer's until it has ended, so that
        `wait_all` from another thread waits for it too."""
        with self._collecting:
            thread = self._thread
            if thread is None:
                return None
            thread.join()
            self._thread = None
            outcome, self._outcome = self._outcome, None
            return outcome


def wait_all() -> None:
    """Waits until no save of any backup in this process is being written
    (each is collected by its backup as usual). A plain `model.fit` that
    raises from another callback calls no hook of the backup's after the
    error: its last save is published within its write's time after `fit`
    returns (and before the process exits)."""
    for writer in list(_WRITERS):
        thread = writer._thread
        if thread is not None:
            thread.join()


def _lower_priority() -> None:
    """Lowers this thread's scheduling priority to `NICENESS` (Linux: a
    thread's own; elsewhere the call is left out)."""
    get_id = getattr(threading, "get_native_id", None)
    if NICENESS and get_id is not None and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, get_id(), NICENESS)
