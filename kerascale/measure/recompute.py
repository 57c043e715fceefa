"""Recomputation weighed against gradient accumulation, where memory binds.

Its design: docs/design/modules.md, `kerascale.measure.recompute`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from kerascale.measure.result import BatchSearchResult
from kerascale.measure.weighing import Candidate, Weighing
from kerascale.plan.reasons import Reason

if TYPE_CHECKING:
    from kerascale.measure.decided import Decided
    from kerascale.measure.request import SearchOptions
    from kerascale.plan.plan import Plan

# Recomputation is kept only where it trains at least this much faster per
# sample than accumulation alone (timings on a shared CPU vary by a few %).
GAIN = 0.05
MODE = "activations"

# (plan, search options, first, accumulation_steps, timed) -> the result.
Searcher = Callable[..., BatchSearchResult]


def binding(decided: Decided, requested: int | None) -> bool:
    """Whether memory binds the batch `decided` trains: a requested batch
    (`requested` per replica) split for memory, or a largest-that-fits
    search stopped by memory (not by its cap)."""
    result = decided.search
    if result is None or decided.plan.recompute:
        return False
    if requested is not None:
        return result.per_replica_batch_size < requested
    return result.mode == "max" and result.smallest_failing is not None


def weighed(
    decided: Decided,
    search: Searcher,
    options: SearchOptions,
    requested: int | None,
) -> Weighing:
    """The weighing of recomputation for `decided`'s batch; its plan is
    `decided`'s own where recomputation does not win.

    Args:
        decided: The decision, with its batch search (`binding` is true).
        search: Runs the engine's batch search for a plan (see `Searcher`).
        options: The search options the decision's search ran under.
        requested: The requested batch per replica, or None for an "auto"
            batch (the largest that fits).
    """
    plan, result = decided.plan, decided.search
    assert result is not None, "weighed only where `binding`: a search ran"
    with_remat = dataclasses.replace(plan, recompute=MODE)
    found = search(
        with_remat,
        options,
        first=requested,
        accumulation_steps=2 if requested else None,
    )
    bound, before = found.per_replica_batch_size, result.per_replica_batch_size
    settled = dataclasses.replace(decided.options, recompute=MODE)
    remat_plan = decided.planner(settled, search=found, measured=decided.measured)
    figures = (
        f"with recomputation {bound} per replica fit in one pass, without {before}"
    )

    def kept(why: str, *candidates: Candidate) -> Weighing:
        not_used = Reason("recompute.not_used", figures=figures, why=why)
        return Weighing(plan, bound, before, candidates, not_used, found)

    if remat_plan.micro_batch_size <= plan.micro_batch_size:
        return kept(", no larger micro-batch")
    asked = decided.options.batch_size
    if requested and plan.global_batch_size == asked != remat_plan.global_batch_size:
        return kept(f", but not for batch_size={asked}")
    alone = Candidate(_name(plan), plan, _speed(search, plan, options))
    remat = Candidate(
        _name(remat_plan), remat_plan, _speed(search, remat_plan, options)
    )
    measured = f"{remat.describe()}; {alone.describe()}"
    if not (alone.samples_per_s and remat.samples_per_s):
        return kept(f"; not both timed ({measured})", remat, alone)
    if remat.samples_per_s < alone.samples_per_s * (1 + GAIN):
        return kept(f", but it was not {GAIN:.0%} faster ({measured})", remat, alone)
    why = Reason("recompute.used", mode=MODE, figures=figures, measured=measured)
    return Weighing(remat_plan, bound, before, (remat, alone), why, found)


def reported(result: BatchSearchResult, found: BatchSearchResult) -> BatchSearchResult:
    """`result` (a search without recomputation, for `find_batch_size`)
    with `found`'s bound (the same search with it) reported beside it."""
    ratio = found.per_replica_batch_size / max(1, result.per_replica_batch_size)
    why = Reason(
        "search.with_recompute",
        bound=found.per_replica_batch_size,
        ratio=ratio,
        without=result.per_replica_batch_size,
    )
    return dataclasses.replace(
        result,
        recompute_batch_size=found.batch_size,
        reasons={**result.reasons, "recompute": why},
    )


def _name(plan: Plan) -> str:
    if not plan.recompute:
        return "accumulation alone" if plan.accumulation_steps > 1 else "as it is"
    if plan.accumulation_steps > 1:
        return "recomputation and accumulation"
    return "recomputation"


def _speed(search: Searcher, plan: Plan, options: SearchOptions) -> float | None:
    """Samples per second of one real run at `plan`'s micro-batch and
    accumulation: a search capped at that batch, timed."""
    micro = plan.micro_batch_size
    at = dataclasses.replace(
        options,
        mode="max",
        max_batch_size=micro * plan.replicas,
        min_steps_per_epoch=1,
    )
    found = search(
        plan, at, first=micro, accumulation_steps=plan.accumulation_steps, timed=True
    )
    speeds = [
        p.samples_per_s
        for p in found.probes
        if p.batch == micro and p.outcome == "ok" and p.samples_per_s
    ]
    return speeds[-1] if speeds else None
