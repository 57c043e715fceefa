"""A model of peak memory against the batch, fitted to probes.

Peak memory of a training step grows about linearly with the batch: a fixed
part (weights, optimizer slots, the runtime) plus a part per sample
(activations kept for the backward pass). `MemoryModel` fits that line to a few
measured probes and predicts the largest batch under a limit; the batch search
then confirms the prediction by probing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from kerascale._units import format_bytes


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
