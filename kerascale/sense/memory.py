"""Memory: what this process uses, and what the machine (or container) has.

On CPU, kerascale limits and measures a probe's *data memory* (Linux's
`RLIMIT_DATA` / `VmData`: the heap and anonymous mappings in which TensorFlow
allocates tensors), not its code and shared libraries, which a limit on
resident memory could not be enforced on without root.
"""

from __future__ import annotations


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
    """This process's data memory (VmData), the quantity RLIMIT_DATA caps."""
    return _status().get("VmData")


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
