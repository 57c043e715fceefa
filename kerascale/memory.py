"""Memory: sizes users write, what a process uses, and a model of it.

Peak memory of a training step grows about linearly with the batch: a fixed
part (weights, optimizer slots, the runtime) plus a part per sample
(activations kept for the backward pass). `MemoryModel` fits that line to a few
measured probes and predicts the largest batch under a limit; the batch search
then confirms the prediction by probing.

On CPU, kerascale limits and measures a probe's *data memory* (Linux's
`RLIMIT_DATA` / `VmData`: the heap and anonymous mappings in which TensorFlow
allocates tensors), not its code and shared libraries, which a limit on
resident memory could not be enforced on without root.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

from kerascale import _validation

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(name: str, value: Any) -> int:
    """Reads a memory size: an int of bytes, or a string like "6GiB", "512MB".

    Raises:
        ConfigurationError: Naming `name` and the value, for anything else
            (negative, zero, a bool, an unknown unit).
    """
    accepted = 'a positive number of bytes or a size like "6GiB" or "512MB"'
    if isinstance(value, bool):
        raise _validation.fail(name, value, accepted)
    if isinstance(value, int):
        if value <= 0:
            raise _validation.fail(name, value, accepted)
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            size = float(match.group(1)) * _UNITS[match.group(2).lower()]
            if size >= 1:
                return int(size)
    raise _validation.fail(name, value, accepted)


def format_bytes(n: float | None) -> str:
    """1536 * 2**20 -> "1.50 GiB"."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """Peak memory = fixed_bytes + per_sample_bytes * batch.

    Attributes:
        fixed_bytes: Memory that does not grow with the batch.
        per_sample_bytes: Memory each sample of the (per-replica) batch adds.
        points: The (batch, peak bytes) measurements it was fitted to.
    """

    fixed_bytes: float
    per_sample_bytes: float
    points: tuple[tuple[int, int], ...] = ()

    def predict(self, batch: int) -> float:
        """Predicted peak bytes at `batch`."""
        return self.fixed_bytes + self.per_sample_bytes * batch

    def max_batch(self, limit_bytes: int) -> int | None:
        """The largest batch predicted to fit under `limit_bytes`; None when
        the model cannot tell (memory does not grow with the batch)."""
        if self.per_sample_bytes <= 0:
            return None
        return max(
            0, math.floor((limit_bytes - self.fixed_bytes) / self.per_sample_bytes)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixed_bytes": self.fixed_bytes,
            "per_sample_bytes": self.per_sample_bytes,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryModel:
        return cls(
            d["fixed_bytes"],
            d["per_sample_bytes"],
            tuple(tuple(p) for p in d.get("points", ())),
        )

    @classmethod
    def fit(cls, points: Sequence[tuple[int, int]]) -> MemoryModel | None:
        """Least-squares line through (batch, peak) points; None with fewer
        than two distinct batches."""
        pts = tuple((int(b), int(m)) for b, m in points)
        if len({b for b, _ in pts}) < 2:
            return None
        n = len(pts)
        mean_b = sum(b for b, _ in pts) / n
        mean_m = sum(m for _, m in pts) / n
        var = sum((b - mean_b) ** 2 for b, _ in pts)
        cov = sum((b - mean_b) * (m - mean_m) for b, m in pts)
        slope = cov / var
        return cls(mean_m - slope * mean_b, slope, pts)

    def __str__(self) -> str:
        return (
            f"{format_bytes(self.fixed_bytes)} + "
            f"{format_bytes(self.per_sample_bytes)} per sample"
        )


# --- What this process (or machine) has ---------------------------------------


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
