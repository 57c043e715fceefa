"""Recomputation weighed against gradient accumulation, where memory binds.

Its design: docs/design/modules.md, `kerascale.measure.recompute`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kerascale.measure import engines
from kerascale.measure.budget import Price
from kerascale.measure.decided import Found
from kerascale.measure.request import (
    AUTO_MIN_STEPS,
    SearchOptions,
    check_options,
    request_for,
)
from kerascale.measure.result import BatchSearchResult
from kerascale.measure.stages import At, Priceless
from kerascale.measure.weighing import Candidate, Weighing
from kerascale.plan.measured import Measured
from kerascale.plan.reasons import Reason
from kerascale.sense.model_facts import gist

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


class Recomputed:
    """Recomputation weighed against accumulation where memory binds the
    batch (`recompute.weighed`), where the run repays it. A weighing that
    fails is dropped with a warning: the plan trains as it was."""

    name = "recompute"

    def skip(self, at: At) -> Found | None:
        decided = at.decided
        if decided.options.recompute != "auto":
            return Found()
        if not binding(decided, at.carried.get("asked")):
            return Found()
        return None

    def price(self, at: At) -> Price | None:
        if at.budget is None:
            return None
        plan, result = at.decided.plan, at.decided.search
        rungs = [p.batch for p in result.probes] + [plan.micro_batch_size] * 2
        return at.budget.search_price(plan, rungs, 3, "recompute")

    def refused(self, at: At, why: str) -> Found:
        refused = Reason("recompute.not_weighed", why=why)
        return Found(Measured().decided(recompute=refused))

    def measure(self, at: At) -> Found:
        decided, given, asked = at.decided, at.given, at.carried.get("asked")
        result = decided.search
        # Each of its searches counts the process where fit trains as the
        # decision's first search did (`SearchRequest.host_share`).
        run = dict(
            instance=decided.instance,
            verbose=decided.options.verbose,
            host_share=result.host_share,
        )
        if asked is None:
            search = at.search or SearchOptions(min_steps_per_epoch=AUTO_MIN_STEPS)
        else:
            search = check_options(at.search, asked * decided.plan.replicas)

        def searcher(
            plan: Plan, options: SearchOptions, **kwargs: Any
        ) -> BatchSearchResult:
            return engines.batch_search(
                request_for(decided, given, plan, options, **{**run, **kwargs})
            )

        try:
            weighing = weighed(decided, searcher, search, asked)
        except Exception as e:  # a model remat cannot trace: trains as planned
            error = f"{type(e).__name__}: {gist(e)}"
            why = Reason("recompute.weigh_failed", error=error)
            return Found(Measured().decided(recompute=why).warned(why))
        plan = weighing.plan
        options = dataclasses.replace(
            decided.options, recompute=plan.recompute or "auto"
        )
        return Found(
            Measured().decided(recompute=weighing.why),
            {
                "options": options,
                "recomputed": weighing,
                "search": weighing.search if plan.recompute else result,
            },
        )


class RecomputeBound(Priceless):
    """find_batch_size's result with the bound under recomputation beside
    the bound without, where memory stopped the search and recomputation is
    not off. A search for it that fails is said in the result's reasons: the
    bound found stands."""

    name = "recompute"

    def skip(self, at: At) -> Found | None:
        decided = at.decided
        result = decided.search
        if (
            decided.plan.recompute
            or result is None
            or decided.options.recompute == "off"
            or result.smallest_failing is None
        ):
            return Found()
        return None

    def measure(self, at: At) -> Found:
        decided, result = at.decided, at.decided.search
        plan = dataclasses.replace(decided.plan, recompute=MODE)
        request = request_for(
            decided, at.given, plan, at.search, host_share=result.host_share
        )
        try:
            found = engines.batch_search(request)
        except Exception as e:  # an optional figure: the bound found stands
            error = f"{type(e).__name__}: {gist(e)}"
            why = Reason("recompute.weigh_failed", error=error)
            said = dataclasses.replace(
                result, reasons={**result.reasons, "recompute": why}
            )
            return Found(settled={"search": said})
        return Found(settled={"search": reported(result, found)})
