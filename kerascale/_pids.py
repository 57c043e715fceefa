"""Whether a process of this machine is alive: what it left (a lease, a
shard being written, a compile cache) is kept while it is."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

# An owner's lock on a directory of its own: held while its process lives,
# released by the kernel when it dies, whatever PID namespace the reader is
# in (a process id of another container's namespace is not visible here).
_OWNER = ".owner"
_held: list[int] = []  # open for the life of this process (a descriptor: a
# file object left open would warn, ResourceWarning, as the process ends)


def alive(pid: Any) -> bool:
    """Whether process `pid` of this machine is alive (signal 0 reaches it,
    or it belongs to another user: kept); False for no process id."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process, or not ours to ask
    return True


def _lock(directory: str) -> int:
    """The open `.owner` file of `directory` (its descriptor), locked
    (`flock`) where the file system allows it: where it does not (some
    network file systems), the directory is still usable, only unmarked, and
    a sweep then goes by its process id and age."""
    import fcntl

    fd = os.open(os.path.join(directory, _OWNER), os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def hold(directory: str) -> None:
    """Marks `directory` as this living process's (an exclusive `flock` on
    its `.owner` file, kept until the process ends)."""
    _held.append(_lock(directory))


def owner_alive(directory: str) -> bool | None:
    """Whether the process that `hold` marked `directory` for still lives;
    None where nothing marked it (an older kerascale's, or one being made)."""
    import fcntl

    try:
        f = open(os.path.join(directory, _OWNER))  # noqa: SIM115
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        with contextlib.suppress(OSError):
            fcntl.flock(f, fcntl.LOCK_UN)
        return False


def sweep(prefix: str) -> None:
    """Removes the temporary directories named `{prefix}{pid}-...` whose
    process is gone (killed before it could remove its own). A process id
    that is not alive here may be another PID namespace's (a container
    sharing this temporary directory): its owner's lock says whether it
    lives; a directory without one is an older kerascale's, or one being
    made (kept for its first minute); one named by no process (an older
    kerascale's name) is removed after an hour."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}*")):
        pid = os.path.basename(path)[len(prefix) :].split("-", 1)
        named = len(pid) == 2 and pid[0].isdigit()
        if named and alive(int(pid[0])):
            continue
        owner = owner_alive(path)
        if owner is None:
            with contextlib.suppress(OSError):
                age = time.time() - os.path.getmtime(path)
                owner = age < (60 if named else 3600)
        if owner is False:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def own_directory(prefix: str) -> Iterator[str]:
    """A temporary directory of this process's (named by its id, its owner's
    lock held) for the block, removed after it; those of `prefix` whose
    process is gone are removed first."""
    sweep(prefix)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    lock = _lock(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)
