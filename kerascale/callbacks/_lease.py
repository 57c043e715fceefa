"""One writer per checkpoint directory: a lease.

Its design: docs/design/modules.md, `kerascale.callbacks._lease`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kerascale import _fs, _pids
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import CheckpointError, warn

NAME = "writer.lease"
DEFAULT_TIMEOUT = 120.0
SETTLE_SECONDS = 2.0

_HELD: dict[str, Lease] = {}  # this process's leases, by token
# This process's reads-then-writes of a lease file, one at a time: a run's
# lease given back by its watcher (`fit` raised) while the next run in this
# process takes the directory over must not remove the new lease.
_FILE_LOCK = threading.Lock()


class Lease:
    """This process's lease on `directory` (see the module doc).

    Args:
        directory: The checkpoint directory.
        timeout: Seconds without renewal after which another host takes over.
        in_use: Whether the run holding it still runs; when it says no, a
            later run in this process takes the lease over.
    """

    def __init__(
        self,
        directory: str,
        timeout: float = DEFAULT_TIMEOUT,
        in_use: Callable[[], bool] = lambda: True,
    ):
        self.directory = directory
        self.in_use = in_use
        self.path = f"{directory.rstrip('/')}/{NAME}"
        self.timeout = timeout
        now = time.time()
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": now,
            "renewed": now,
            "token": uuid.uuid4().hex,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why the lease is no longer ours

    # --- taking, checking, giving back --------------------------------------

    def acquire(self) -> Lease:
        """Takes the lease, or raises CheckpointError naming the holder."""
        for _ in range(3):
            holder = read(self.path)
            if holder is not None:
                why = stale(holder, self.timeout)
                if why is None:
                    raise CheckpointError(
                        f"{self.directory} is being written by another run: "
                        f"{describe(holder)}. Two writers would interleave "
                        "their checkpoints. Stop that run, or pass another "
                        f"directory. A lease not renewed for {self.timeout:g} s "
                        "(its process killed or frozen) is taken over."
                    )
                warn(
                    f"Taking over the checkpoint directory {self.directory} from "
                    f"{describe(holder)}: {why}."
                )
                earlier = _HELD.get(holder.get("token"))
                if earlier is not None:  # this process's, its run over
                    earlier.release()
            with _FILE_LOCK:
                if holder is not None and read(self.path) == holder:
                    _remove(self.path)  # not another taker's new lease
                created = self._create()
                if created:
                    _HELD[self.record["token"]] = self
            if created:
                self._start_renewing()
                return self
        raise CheckpointError(
            f"Could not take the lease on {self.directory}: other runs keep "
            "taking it. Run one writer per checkpoint directory."
        )

    def check(self) -> None:
        """Raises CheckpointError unless the lease is still this process's."""
        if self.lost is None:
            self.lost = self._not_ours()
        if self.lost is not None:
            raise CheckpointError(
                f"This run no longer holds the lease on {self.directory} "
                f"({self.lost}), so it stops without committing: another run "
                "writes there now."
            )

    def release(self) -> None:
        """Stops renewing and removes the lease if it is still ours."""
        self._stop.set()
        _HELD.pop(self.record["token"], None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None
        with _FILE_LOCK:
            holder = read(self.path)
            if holder is not None and holder.get("token") == self.record["token"]:
                _remove(self.path)

    # --- internals -----------------------------------------------------------

    def _create(self) -> bool:
        data = json.dumps(self.record).encode()
        if store.is_local(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        if _fs.exists(self.path):
            return False
        store.write_bytes(self.path, data)
        time.sleep(SETTLE_SECONDS)  # a writer that started meanwhile wins
        holder = read(self.path)
        return holder is not None and holder.get("token") == self.record["token"]

    def _not_ours(self) -> str | None:
        """Why the lease file is no longer this process's, or None."""
        holder = read(self.path)
        if holder is None:
            return "it was removed"
        if holder.get("token") != self.record["token"]:
            return f"it was taken over by {describe(holder)}"
        return None

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._renew, name="kerascale-lease", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.timeout / 4):
            try:
                with _FILE_LOCK:
                    if self._stop.is_set():
                        return  # given back meanwhile: write nothing
                    self.lost = self._not_ours()
                    if self.lost is not None:
                        return
                    self.record["renewed"] = time.time()
                    temp = f"{self.path}.renew-{self.record['token']}"
                    store.write_bytes(temp, json.dumps(self.record).encode())
                    _fs.rename(temp, self.path)
            except OSError:
                continue  # storage hiccup: the next renewal tries again


def taken(
    directory: str, timeout: float, in_use: Callable[[], bool]
) -> tuple[Lease | None, str | None]:
    """The directory's lease, taken (the directory made if missing), or
    (None, why it could not be)."""
    _fs.makedirs(directory)
    try:
        lease = Lease(directory, timeout, in_use=in_use)
        lease.acquire()
    except CheckpointError as e:
        return None, str(e)
    return lease, None


def read(path: str) -> dict[str, Any] | None:
    """The lease at `path`, or None when there is none. An unreadable lease
    (a writer killed while writing it) counts as renewed long ago."""
    try:
        with _fs.open_file(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(raw.decode("utf-8"))
        if isinstance(holder, dict):
            return holder
    except (UnicodeDecodeError, ValueError):
        pass
    return {"host": "?", "pid": -1, "started": 0.0, "renewed": 0.0, "token": ""}


def stale(holder: dict[str, Any], timeout: float) -> str | None:
    """Why `holder`'s lease may be taken over, or None while it is live."""
    here = holder.get("host") == socket.gethostname()
    if here and holder.get("pid") == os.getpid():
        mine = _HELD.get(holder.get("token"))
        if mine is None:
            return (
                "it names this process but was not taken by it (an earlier "
                "process with the same pid)"
            )
        if not mine.in_use():
            return (
                "an earlier run in this process ended without giving it back "
                "(it raised)"
            )
        return None
    if here and not _pids.alive(holder.get("pid")):
        return f"process {holder.get('pid')} on this host is no longer running"
    age = time.time() - float(holder.get("renewed") or 0.0)
    if age > timeout:
        return f"its lease was last renewed {age:.0f} s ago (more than {timeout:g} s)"
    return None


def describe(holder: dict[str, Any]) -> str:
    started = time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started") or 0))
    )
    return (
        f"process {holder.get('pid')} on host {holder.get('host')!r}, started {started}"
    )


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _fs.remove(path)
