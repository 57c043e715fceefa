"""Memory: what this process uses, and what the machine (or container) has.

On CPU, `memory_limit` means *resident memory* (Linux's RSS, `VmRSS`): what a
container's memory limit (cgroups) and the kernel's out-of-memory killer
count. Virtual data memory (`VmData`, what `RLIMIT_DATA` caps) is not it:
thread stacks and allocator arenas that are reserved but never touched count
there and not against a container, so a limit on it stops well short of the
memory that actually runs out (and makes a thread that cannot be created look
like memory running out).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Iterator
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _status() -> dict[str, int]:
    """Sizes in bytes from /proc/self/status (VmData, VmHWM, VmRSS...)."""
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def data_bytes() -> int | None:
    """This process's virtual data memory (VmData), what RLIMIT_DATA caps."""
    return _status().get("VmData")


def resident_bytes() -> int | None:
    """This process's resident memory now (VmRSS), read cheaply from statm."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def resident_peak_bytes() -> int | None:
    """The highest resident memory of this process (VmHWM), kept by Linux."""
    return _status().get("VmHWM")


def release_freed() -> bool:
    """Frees what is garbage (`gc.collect`) and hands the heap this process
    has freed back to the kernel (glibc's `malloc_trim(0)`), so that
    resident memory counts what is in use. XLA's compiler frees what it used
    when a compile ends, but glibc keeps the pages: after a JAX batch
    search's five compiles a CPU process held about 100 MB more than before
    them (60 MB of it garbage in cycles, the rest freed heap), and a step at
    the batch found then went over the limit in that process. False where
    this C library has no `malloc_trim` (macOS, musl): only the garbage is
    freed."""
    collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


# Inside `planning`: whether it froze the heap (then unfreezes it), and how
# deep its regions nest. fit, plan and the searches plan on one thread.
_planning = {"depth": 0, "froze": False}


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """A region of planning, whose garbage collections (`collect`) traverse
    only the objects made inside it. A full collection in a process with
    TensorFlow loaded walks its ~400,000 objects: 0.17 s each, and a CPU
    search took six (1.7 s of a 1-minute run's planning). The first
    `collect` inside collects in full, then freezes what survives
    (`gc.freeze`); at the end, what the region made is collected and the
    heap unfrozen (its objects go back to the oldest generation). A region
    that collects nothing costs nothing. Where the heap is frozen already
    (the user froze it), collections are full, as without a region."""
    _planning["depth"] += 1
    try:
        yield
    finally:
        _planning["depth"] -= 1
        if _planning["depth"] == 0 and _planning["froze"]:
            _planning["froze"] = False
            try:
                gc.collect()
            finally:
                gc.unfreeze()


def collect() -> None:
    """`gc.collect()`; inside `planning`, of what the region made."""
    gc.collect()
    if _planning["depth"] and not _planning["froze"] and not gc.get_freeze_count():
        gc.freeze()
        _planning["froze"] = True


@functools.cache
def _malloc_trim() -> Any:
    """glibc's `malloc_trim`, found among the symbols this process has
    loaded (no search of the library path, no subprocess), or None."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


# glibc's default mmap threshold: buffers this large or larger are mapped on
# their own, and handed back to the kernel when freed.
MMAP_THRESHOLD = 128 << 10
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


_mmap_fixed: bool | None = None  # None: not tried in this process


def fix_mmap_threshold() -> bool:
    """Fixes glibc's mmap threshold at its default, 128 KiB, for the rest of
    this process (`mallopt`), as `MALLOC_MMAP_THRESHOLD_` does at a
    process's start; False where this C library has no `mallopt` (macOS,
    musl) or refused.

    glibc raises the threshold each time a mapped buffer is freed (up to 32
    MiB), so a process that has worked a while keeps buffers a fresh one
    maps on its heap, where freed pages stay resident and scatter. A
    TensorFlow MLP's 2 steps at batch 5728 peaked 1184 MiB in a fresh
    process and 1310 MiB after a batch search in the same one; with the
    threshold fixed, a probe's peak and the training's are a fresh
    process's. glibc cannot go back to its sliding threshold. Step time
    measured with it fixed: an MLP at batch 1024 4% slower, at 6000 and a
    CNN at 64 the same (2 cores)."""
    global _mmap_fixed
    if _mmap_fixed is None:
        import ctypes

        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError, TypeError):
            _mmap_fixed = False
        else:
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            mallopt.restype = ctypes.c_int
            _mmap_fixed = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return _mmap_fixed


def mmap_threshold_fixed() -> bool:
    """Whether `fix_mmap_threshold` fixed it in this process."""
    return bool(_mmap_fixed)


def reset_resident_peak() -> bool:
    """Resets VmHWM to the resident memory now (Linux >= 4.0); False where
    it cannot, when the peak then covers the process's whole life."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


def available_bytes() -> int | None:
    """Memory this machine (or container) can still give: MemAvailable,
    capped by a cgroup memory limit where one is set."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    for path in (
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ):
        limit = _read_int(path)
        if limit and limit < (1 << 60):
            usage = (
                _read_int(
                    path.replace("memory.max", "memory.current").replace(
                        "limit_in_bytes", "usage_in_bytes"
                    )
                )
                or 0
            )
            room = max(0, limit - usage)
            avail = room if avail is None else min(avail, room)
    return avail


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
