"""Measuring, before committing, the decisions a rule can get wrong on a CPU.

Its design: docs/design/modules.md, `kerascale.measure.trials`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kerascale._display import said
from kerascale.measure import cache
from kerascale.measure.decided import Found
from kerascale.measure.request import Given
from kerascale.measure.stages import At, Priceless
from kerascale.measure.trial_bench import Bench
from kerascale.measure.trial_result import MAX_ATTEMPTS, MIN_GAIN, Trial, TrialResult
from kerascale.plan import precision as precision_rules
from kerascale.plan import strategy as strategy_rules
from kerascale.plan.measured import Measured
from kerascale.plan.reasons import Reason
from kerascale.sense import data_facts, data_signature

if TYPE_CHECKING:
    from kerascale.measure.result import BatchSearchResult
    from kerascale.plan.options import Options
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.hardware import Hardware
    from kerascale.sense.model_facts import ModelFacts


def possible(options: Options, hw: Hardware, model: ModelFacts) -> bool:
    """Trials run on a CPU host, for a model kerascale can copy (or train
    and put back), under a strategy it builds itself; not on a cluster, whose
    workers would time them differently and could choose differently."""
    return (
        hw.accelerator == "cpu"
        and isinstance(options.strategy, str)
        and model.measurable
        and not strategy_rules.wants_cluster(hw, options.strategy)
    )


def wanted(
    options: Options,
    plan: Plan,
    data: DataFacts,
    x: Any,
    hw: Hardware,
    search: BatchSearchResult | None = None,
) -> tuple[bool, str, Reason | None]:
    """(try the pipeline, the precision to time against float32 or "", why
    the precision is not timed where it would be, or None): the choices left
    to kerascale where the alternatives differ. The precision is the plan's,
    or where the plan keeps float32 on a CPU with bf16 math that its
    backend's compiler may not use well (JAX), mixed_bfloat16; not where
    float32 would not fit the batch `search` found (`float32_over`)."""
    pipeline = (
        options.optimize_data == "auto"
        and data.kind == "dataset"
        and data_facts.has_map(x)
    )
    candidate = plan.precision
    if candidate == "float32":
        candidate = precision_rules.trial_candidate(hw) or candidate
    precision = (
        options.precision == "auto"
        and candidate != "float32"
        and data.kind != "pydataset"
        and data.measurable
    )
    over = float32_over(search, plan) if precision else None
    return pipeline, candidate if precision and over is None else "", over


def float32_over(result: BatchSearchResult | None, plan: Plan) -> Reason | None:
    """Why float32 cannot be timed against the plan's narrower precision at
    the plan's batch, or None: the batch was searched under that precision
    with a memory limit, and float32's activations, twice as wide, are
    predicted over it by the search's memory model (the trials train in the
    process where fit trains: a CNN's float32 trial at the batch searched
    under bf16 took that process from 771 to 1170 MiB under a 1 GiB limit)."""
    if plan.precision == "float32" or result is None or not result.limit_bytes:
        return None
    model, batch = result.memory_model, plan.micro_batch_size
    if model is None:  # no fit of the probes (XLA's count): what they found
        if result.smallest_failing is None or 2 * batch < result.smallest_failing:
            return None
        need = None
    else:
        need = model.fixed_bytes + 2 * model.per_sample_bytes * batch
        if need <= result.limit_bytes:
            return None
    return Reason(
        "trials.float32_over",
        batch=batch,
        policy=plan.precision,
        need=need,
        limit=result.limit_bytes,
    )


def run(
    given: Given,
    data: Any,
    plan: Plan,
    hw: Hardware,
    *,
    try_pipeline: bool,
    try_precision: str,
    optimize: bool = True,
    verbose: Any = "auto",
    fresh: bool = False,
    run_samples: int | None = None,
    unbudgeted: bool = False,
    first_speed: Callable[[], float | None] | None = None,
) -> TrialResult:
    """Measures the candidates and returns the choices (cached).

    Args:
        given: The user's model and data (the candidates train copies).
        data: What the data is (`sense.data_facts`).
        optimize: The pipeline setting when it is not tried.
        fresh: Measure again even when the cache has an answer.
        run_samples: The samples the run will train (epochs x samples per
            epoch), for the budget; None when unknown (then nothing is
            measured), unless `unbudgeted`.
        unbudgeted: No budget (no run to weigh against: `diagnose`).
        first_speed: Returns a first estimate of samples/s, for the budget
            when neither the search's probes nor an earlier run measured one.
    """
    key = cache.cache_key(
        {
            "trials": 3,
            "model": cache.model_fingerprint(given.model),
            "data": data_signature.signature(given.x),
            "plan": [plan.precision, plan.step_batch_size, plan.strategy],
            # [] where batches were listed: no batch is timed before the run
            # (issue 78), and the key of a cached answer stays as it was.
            "candidates": [try_pipeline, try_precision, [], optimize],
            "hardware": hw.to_dict(),
        }
    )
    cached = None if fresh else _read(key)
    decided = cached is not None and bool(cached.trials)
    if decided and not (cached.uncertain and cached.attempts < MAX_ATTEMPTS):
        return cached
    # A first speed: one a shorter run measured (so that weighing a run never
    # needs a candidate prepared again), else the first estimate (an eager
    # forward pass), taken only where a stage could repay itself in steps.
    speed = cached.speed if cached else None
    later = first_speed if not speed and not unbudgeted else None
    bench = Bench(given, data, plan, verbose)
    bench.budget_for(run_samples, unbudgeted, speed, later)
    with bench:
        result = _stages(bench, plan, try_pipeline, try_precision, optimize)
    if decided and not result.trials:
        return cached  # a later run too short to measure again: keep it
    result = dataclasses.replace(
        result,
        attempts=(cached.attempts + 1) if decided else 1,
        seconds=bench.spent,
        run_seconds=bench.run_seconds,
        speed=bench.speed,
    )
    if result.trials or result.speed:
        cache.cache_write("trials", key, result.to_dict())
    if verbose != 0 and result.trials:
        print(said(f"kerascale: {result.cost()}"), flush=True)
    return result


def _read(key: str) -> TrialResult | None:
    d = cache.cache_read("trials", key)
    try:
        return TrialResult.from_dict(d) if d is not None else None
    except (KeyError, TypeError, ValueError):
        return None  # an entry from another version: measure again


def _stages(bench, plan, try_pipeline, try_precision, optimize):
    """The pipeline and the precision, each where its expected saving repays
    its cost (`Bench.value`), the more valuable first, each timed at the
    choices made so far."""
    batch, policy = plan.micro_batch_size, plan.precision
    pipe = True if try_pipeline else optimize
    uncertain: list[str] = []

    def keys(field: str) -> list[tuple]:
        if field == "data_changes":
            return [(batch, policy, False), (batch, policy, True)]
        return [(batch, "float32", pipe), (batch, try_precision, pipe)]

    stages = [
        field
        for field, wanted in (
            ("data_changes", try_pipeline),
            ("precision", bool(try_precision)),
        )
        if wanted
    ]
    while stages:
        field = max(stages, key=lambda f: bench.value(keys(f), f))
        stages.remove(field)
        trials = bench.compare(keys(field), field)
        if not trials:
            continue
        chosen, doubt = _better(*trials)
        if field == "data_changes":
            pipe = chosen[2]
        else:
            policy = chosen[1]
        uncertain += [field] if doubt else []
    return TrialResult(
        batch,
        policy,
        pipe,
        tuple(bench.trials),
        uncertain=tuple(uncertain),
        skipped=tuple(bench.skipped),
    )


def _paired(slow: Trial, fast: Trial) -> tuple[float, float, bool]:
    """How much faster `fast` ran than `slow`, round by round (they were
    timed in the same rounds, so a busy moment hits both): (mean gain,
    half the range of the per-round gains, whether `fast` won every round)."""
    rounds = min(len(slow.repeats), len(fast.repeats))
    pairs = zip(slow.repeats[:rounds], fast.repeats[:rounds], strict=True)
    ratios = [f / s for s, f in pairs if s > 0 and f > 0]
    if not ratios:
        return 0.0, 0.0, False
    gain = sum(ratios) / len(ratios) - 1
    return gain, (max(ratios) - min(ratios)) / 2, min(ratios) > 1


def _faster(slow: Trial, fast: Trial) -> tuple[bool, bool]:
    """(whether `fast` is faster beyond noise: a mean gain above half the
    range of the per-round gains and MIN_GAIN, and a win in every round;
    whether the comparison fell within noise)."""
    gain, noise, every_round = _paired(slow, fast)
    clear = every_round and gain > max(noise, MIN_GAIN)
    return clear, not clear and noise > MIN_GAIN and abs(gain) <= 2 * noise


def _better(plain: Trial, other: Trial) -> tuple[tuple, bool]:
    """(the chosen key, whether the decision was within noise): `other` only
    when faster than `plain` beyond noise (`_faster`)."""
    if plain.failed or other.failed:
        return (plain if not plain.failed else other).key, False
    clear, doubt = _faster(plain, other)
    return (other if clear else plain).key, doubt


class Trials(Priceless):
    """Timing, on the real data, the CPU choices left to kerascale before the
    run: the pipeline and the precision. Each trial is weighed by the gate
    inside the bench (`trial_bench.Bench.budget_for`: its price is known only
    once a first candidate is timed)."""

    name = "trials"

    def __init__(self, *, after_search: bool = False):
        self.after_search = after_search  # only where a search answered

    def skip(self, at: At) -> Found | None:
        decided = at.decided
        if self.after_search and decided.search is None:
            return Found()
        options, hw = decided.options, decided.hardware
        return None if possible(options, hw, decided.model) else Found()

    def measure(self, at: At) -> Found:
        decided, given, budget = at.decided, at.given, at.budget
        options, plan = decided.options, decided.plan
        try_pipeline, try_precision, over = wanted(
            options, plan, decided.data, given.x, decided.hardware, decided.search
        )
        found = Measured()  # the trials' reasons, and why a stage was not run
        if over is not None:
            found = found.noted("precision", f"trials skipped: {over}")
        if not (try_pipeline or try_precision):
            return Found(found)
        measured = run(
            given,
            decided.data,
            plan,
            decided.hardware,
            try_pipeline=try_pipeline,
            try_precision=try_precision,
            optimize=decided.optimize_data,
            verbose=options.verbose,
            fresh=options.remeasure,
            run_samples=budget.samples(plan) if budget is not None else None,
            unbudgeted=budget is None,
            first_speed=budget.speed if budget is not None else None,
        )
        settled = dataclasses.replace(
            options,
            precision=measured.precision
            if measured.measured("precision")
            else options.precision,
            optimize_data=measured.optimize_data
            if measured.measured("data_changes")
            else options.optimize_data,
        )
        tried = (("precision", try_precision), ("data_changes", try_pipeline))
        for field, asked in tried:
            if measured.measured(field):
                found = found.decided(**{field: measured.why(field)})
            elif asked and measured.skip_reason(field):
                skipped = measured.skip_reason(field)
                found = found.noted(field, f"trials skipped: {skipped}")
        optimize = (
            measured.optimize_data
            if measured.measured("data_changes")
            else decided.optimize_data
        )
        return Found(
            found,
            {"options": settled, "optimize_data": optimize, "trials": measured},
        )
