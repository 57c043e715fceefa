"""What weighing recomputation against accumulation found (`measure.recompute`
weighs; a decision keeps the record, `Decided.recomputed`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kerascale.measure.result import BatchSearchResult
    from kerascale.plan.plan import Plan
    from kerascale.plan.reasons import Reason


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to train the batch: its plan and its measured speed."""

    name: str
    plan: Plan
    samples_per_s: float | None

    def describe(self) -> str:
        p = self.plan
        speed = (
            f"{self.samples_per_s:,.0f} samples/s"
            if self.samples_per_s
            else "not timed"
        )
        return (
            f"{self.name}: {p.micro_batch_size} x {p.replicas} x "
            f"{p.accumulation_steps} at {speed}"
        )


@dataclasses.dataclass(frozen=True)
class Weighing:
    """What weighing recomputation found.

    Attributes:
        plan: The plan to train (with recomputation where it won).
        bound: The largest per-replica batch that fits in one pass with
            recomputation.
        bound_without: The same without (the decision's own search).
        candidates: The timed candidates (empty where none ran).
        why: The plan's "recompute" reason.
        search: The batch search with recomputation.
    """

    plan: Plan
    bound: int
    bound_without: int
    candidates: tuple[Candidate, ...]
    why: Reason
    search: BatchSearchResult | None = None

    @property
    def ratio(self) -> float:
        """The largest batch with recomputation over without."""
        return self.bound / max(1, self.bound_without)
