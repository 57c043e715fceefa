"""Facts, measurements and the plan: shared by `fit`, `plan`, `diagnose` and
`find_batch_size`.

Its design: docs/design/modules.md, `kerascale.measure.decide`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from kerascale import _tf
from kerascale._keras_compat import leaves_no_trace
from kerascale.apply import strategy as strategy_lib
from kerascale.measure import batch as batch_lib
from kerascale.measure import budget as budget_lib
from kerascale.measure import engines, first_step, host_path
from kerascale.measure import recompute as recompute_lib
from kerascale.measure import request as request_lib
from kerascale.measure import trials as trials_lib
from kerascale.measure.batch_plan import (
    AUTO_MIN_STEPS,
    ProbeFailed,
    batch_for_plan,
    check_options,
    probeable,
)
from kerascale.measure.cluster_plan import agree
from kerascale.measure.decided import Decided
from kerascale.measure.request import Given, SearchOptions, SearchRequest
from kerascale.measure.result import BatchSearchResult
from kerascale.measure.search import fastest_small
from kerascale.plan.fallback import Attempt, FailedInProbe, LateCoreCount
from kerascale.plan.measured import NOTHING, Measured
from kerascale.plan.options import Options, pinned_reasons, user_instance
from kerascale.plan.plan import Plan
from kerascale.plan.planner import Planner
from kerascale.plan.reasons import Reason
from kerascale.plan.rules import searched_batch
from kerascale.plan.steps import StepsLimit
from kerascale.sense import data_facts, memory, samples
from kerascale.sense import hardware as hardware_lib
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import gist, model_facts


def _search_anyway(hw: Hardware) -> str:
    """How to get the batch the skipped search would have picked (its mode;
    "max" is find_batch_size's default)."""
    mode = batch_lib.auto_mode(hw)
    mode = "" if mode == "max" else f", mode={mode!r}"
    return (
        "to search anyway, pass batch_size=kerascale.find_batch_size(model, "
        f"data{mode}).batch_size"
    )


def validate_options(**kwargs: Any) -> tuple[Options, SearchOptions]:
    """`fit`'s, `plan`'s and `diagnose`'s planning arguments, checked at the
    door: the `Options`, and the batch search's options (the memory bounds)."""
    memory = {k: kwargs.pop(k, None) for k in ("memory_limit", "device_memory")}
    options = Options.validate(**kwargs)
    search = SearchOptions.validate(
        max_batch_size=options.max_batch_size,
        **memory,
        min_steps_per_epoch=AUTO_MIN_STEPS,
        force=options.remeasure,
    )
    return options, search


def _in_planning_region(decide_fn: Callable[..., Decided]) -> Callable[..., Decided]:
    """`decide` inside `memory.planning()` (its collections walk only what
    planning made); its compiles, probes and trials leave garbage and freed
    heap in this process, which training's memory was planned without, so
    they are handed back at its end. Where nothing was measured that is not
    done: a full collection costs 0.17 s in a TensorFlow process. Its
    measurements trace train steps anew on purpose: TensorFlow's retracing
    warning is not said for them (`_tf.quiet_retracing`)."""

    @functools.wraps(decide_fn)
    def planned(*args: Any, **kwargs: Any) -> Decided:
        with memory.planning(), _tf.quiet_retracing():
            decided = decide_fn(*args, **kwargs)
            if decided.measured_here:
                memory.release_freed()
            return decided

    return planned


@_in_planning_region
@leaves_no_trace
def decide(
    model: Any,
    x: Any,
    y: Any,
    options: Options,
    *,
    steps_per_epoch: Any = None,
    validation_split: Any = None,
    epochs: int | None = None,
    search: SearchOptions | None = None,
    hardware: Hardware | None = None,
    attempt: Attempt | None = None,
    clustered: bool = False,
    pinned: tuple[str, ...] = (),
    materialized: str = "",
    steps_limit: StepsLimit | None = None,
) -> Decided:
    """Facts, the first plan, then each measurement stage once, in order:
    sharding, the batch search, the trials, recomputation, the steps per
    call (`host_path`), the cluster's agreement, then what the run brings
    (a resumed checkpoint's pins, a materialized input, the ladder's
    findings), and a TPU's core count.
    Each stage measures only where the run repays it, and the plan is made
    again from what it found. No stage retries: a failure that kerascale
    answers is raised as a `plan.fallback.Recoverable`, for the door's ladder.

    Args:
        model: The user's model or builder.
        x, y: The training data.
        options: Validated options.
        steps_per_epoch: For the infinite-dataset check and the trials'
            budget.
        validation_split: `fit`'s: arrays train on the samples it leaves.
        epochs: The epochs the run will train, for the trials' budget; None
            for no budget (nothing trains after: `diagnose`).
        search: Batch-search options; defaults apply when None.
        hardware: Reuse a detection instead of detecting again.
        attempt: The ladder's attempt this decides (None: the first): what
            earlier attempts found of the model (it cannot be re-created, or
            laid out over the devices) and the rungs' reasons, added last.
        clustered: This process joined a cluster: all workers agree.
        pinned: Options set from a resumed checkpoint's plan (their reasons
            say so).
        materialized: Where the input was materialized to, or "".
        steps_limit: The bounds the run's callbacks put on an "auto" steps
            per call (None: none).

    Raises:
        plan.fallback.Recoverable: A failure that a rung of the ladder answers.
    """
    given = Given(model, x, y)
    planner = _planner(
        given, options, hardware, attempt, steps_per_epoch, validation_split
    )
    hw, facts, data = planner.hardware, planner.model, planner.data
    budget = None
    if epochs is not None and data.measurable:  # a run to weigh measurements against
        budget = budget_lib.RunBudget(
            data,
            epochs,
            steps_per_epoch,
            lambda: first_step.train_seconds_per_sample(model, x, y, data),
        )
    options, found = engines.sharding(hw.backend)(model, x, y, options, planner, search)
    first = planner(options, measured=found)
    # The batch per replica asked for (None for "auto"), before a split.
    asked = None if searched_batch(options, data) else first.micro_batch_size
    can_try = trials_lib.possible(options, hw, facts)
    decided, ladder = _batch_searched(
        given, options, planner, first, found, search, can_try, budget
    )
    if can_try:
        decided = _tried(decided, given, ladder, budget)
    if options.recompute == "auto":
        decided = _recomputed(decided, given, search, asked, budget)
    if epochs is not None:  # a run follows, whose steps per call it sets
        cluster = hw.cluster
        decided = host_path.chosen(
            decided,
            given,
            steps_limit,
            budget,
            steps_per_epoch=steps_per_epoch,
            on_cluster=clustered or (cluster is not None and cluster.is_multi_worker),
        )
    if clustered:
        decided = agree(decided)
    brought = Measured(materialized=materialized)
    if attempt is not None:
        brought = brought | attempt.measured
    if pinned:
        brought = Measured().decided(**pinned_reasons(pinned)) | brought
    if brought != NOTHING:
        decided = decided.replanned(brought)
    return _settle_tpu(decided)


def _planner(
    given: Given,
    options: Options,
    hardware: Hardware | None,
    attempt: Attempt | None,
    steps_per_epoch: Any = None,
    validation_split: Any = None,
) -> Planner:
    """The facts (hardware, model, data) that every plan of a decision is
    made over, with what an earlier attempt found of the model."""
    data = data_facts.inspect(
        given.x,
        given.y,
        steps_per_epoch=steps_per_epoch,
        validation_split=validation_split,
    )
    # Through the module, so that tests can replace the hardware seam.
    hw = hardware or hardware_lib.detect_hardware()
    # One CPU under the default strategy: no scope to re-create the model in
    # (the round trip of every layer's config cost a keras-hub task 0.8 s).
    alone = (
        hw.accelerator == "cpu"
        and hw.cluster is None
        and options.strategy in ("auto", "default")
    )
    facts = model_facts(
        given.model,
        options.strategy,
        sample=lambda: samples.sample_inputs(given.x, data),
        scoped=not alone,
    )
    if attempt is not None and attempt.not_rebuildable:
        facts = facts.without_rebuild(attempt.not_rebuildable)
    if attempt is not None and attempt.unplaceable:
        facts = facts.without_placing(attempt.unplaceable)
    return Planner(hw, facts, data)


@_in_planning_region
@leaves_no_trace
def decide_search(
    model: Any,
    x: Any,
    y: Any,
    options: Options,
    search: SearchOptions,
    *,
    attempt: Attempt | None = None,
) -> Decided:
    """`find_batch_size`'s decision: the batch search on its own, whatever
    batch the data brings. Its stages: sharding, the search (whose failures
    are the caller's errors, `BatchSizeSearchError`), the precision trials
    where a CPU has the choice, the bound with recomputation beside the
    bound without, and a TPU's core count. Nothing trains after it, so no
    stage is weighed against a run.

    Raises:
        BatchSizeSearchError: Where the data or the model cannot be probed,
            or a probe fails.
        plan.fallback.Recoverable: A failure that a rung of the ladder answers.
    """
    given = Given(model, x, y)
    planner = _planner(given, options, None, attempt)
    hw, facts, data = planner.hardware, planner.model, planner.data
    options, found = engines.sharding(hw.backend)(model, x, y, options, planner, search)
    plan = planner(options, measured=found)
    probeable(facts, data, hw)
    instance = user_instance(options)
    request = _request_for(given, data, plan, hw, search, instance, options.verbose)
    skipped = ""
    try:
        result = _engine_search(request)
    except request_lib.SearchSkipped as e:  # no answer here: the caller says why
        result, skipped = None, str(e)
    decided = Decided(
        hw,
        facts,
        data,
        planner(options, search=result, measured=found),
        instance,
        options,
        result,
        False,
        search_skipped=skipped,
        measured=found,
    )
    if result is not None and trials_lib.possible(options, hw, facts):
        decided = _tried(decided, given, False, None)
    decided = _recompute_bound(decided, given, search)
    if attempt is not None and attempt.measured != NOTHING:
        decided = decided.replanned(attempt.measured)
    return _settle_tpu(decided)


def _engine_search(request: SearchRequest) -> BatchSearchResult:
    """The engine's answer to `request`, its errors as they are."""
    return engines.batch_search(request)


def _request_for(
    given: Given,
    data: Any,
    plan: Plan,
    hw: Hardware,
    options: SearchOptions | None,
    instance: Any,
    verbose: Any,
    **run: Any,
) -> SearchRequest:
    return SearchRequest(
        given,
        data,
        plan,
        hw,
        options,
        instance=instance,
        verbose=verbose,
        **run,
    )


def _recompute_bound(decided: Decided, given: Given, search: SearchOptions) -> Decided:
    """`find_batch_size`'s result with the bound under recomputation beside
    the bound without, where memory stopped the search and recomputation is
    not off. A search for it that fails is said in the result's reasons: the
    bound found stands."""
    result = decided.search
    if (
        decided.plan.recompute
        or result is None
        or decided.options.recompute == "off"
        or result.smallest_failing is None
    ):
        return decided
    plan = dataclasses.replace(decided.plan, recompute=recompute_lib.MODE)
    request = _request(decided, given, plan, search, host_share=result.host_share)
    try:
        found = _engine_search(request)
    except Exception as e:  # an optional figure: the bound found stands
        why = Reason("recompute.weigh_failed", error=f"{type(e).__name__}: {gist(e)}")
        reasons = {**result.reasons, "recompute": why}
        return dataclasses.replace(
            decided, search=dataclasses.replace(result, reasons=reasons)
        )
    return dataclasses.replace(decided, search=recompute_lib.reported(result, found))


def _batch_searched(
    given: Given,
    options: Options,
    planner: Planner,
    plan: Plan,
    found: Measured,
    search: SearchOptions | None,
    can_try: bool,
    budget: budget_lib.RunBudget | None,
) -> tuple[Decided, bool]:
    """The decision with the batch search's answer in it (measured only where
    `budget`'s run repays it; None: no budget), and whether the search ran as
    a ladder of rungs for the trials. `plan`: the first plan, over `found`
    (what sharding found).

    A probe that fails for a reason other than memory is not fit's error to
    raise: under a mixed precision kerascale chose, it is the ladder's
    `FailedInProbe`; otherwise the search is dropped (the real run then
    raises the model's error, as `model.fit` would)."""
    hw, facts, data = planner.hardware, planner.model, planner.data
    skipped, hint = "", None
    try:
        result, ladder, note = batch_for_plan(
            given,
            options,
            planner,
            plan,
            search,
            can_try=can_try,
            budget=budget,
        )
    except request_lib.SearchSkipped as e:
        result, ladder, note, skipped, hint = None, False, "", str(e), e.hint
    except ProbeFailed as e:
        if options.precision == "auto" and plan.precision != facts.policy:
            raise FailedInProbe(
                str(e), tried=plan.precision, policy=facts.policy
            ) from e
        result, ladder = None, False
        note = (
            f"No batch search: a probe failed for a reason other than memory "
            f"({e}). Training at Keras's default batch; pass batch_size= to choose."
        )
    found = found.warned(note)
    if skipped:
        hint = hint or _search_anyway(hw)
        found = found.noted(
            "global_batch_size", f"batch search skipped: {skipped}; {hint}"
        )
    decided = Decided(
        hw,
        facts,
        data,
        planner(options, search=result, measured=found),
        user_instance(options),
        options,
        result,
        options.optimize_data is not False,
        search_skipped=skipped,
        measured=found,
    )
    return decided, ladder


def _recomputed(
    decided: Decided,
    given: Given,
    search: SearchOptions | None,
    asked: int | None,
    budget: budget_lib.RunBudget | None,
) -> Decided:
    """`decided` with recomputation weighed where memory binds its batch
    (`recompute.weighed`), where `budget`'s run repays it (None: always).
    `asked`: the requested batch per replica, None for an "auto" one. A
    weighing that fails is dropped with a warning: the plan trains as it
    was."""
    result = decided.search
    if decided.plan.recompute or result is None:
        return decided
    # Each of its searches counts the process where fit trains as the
    # decision's first search did (`SearchRequest.host_share`).
    run = dict(
        instance=decided.instance,
        verbose=decided.options.verbose,
        host_share=result.host_share,
    )
    if not recompute_lib.binding(decided, asked):
        return decided
    rungs = [p.batch for p in result.probes] + [decided.plan.micro_batch_size] * 2
    if budget is not None and (
        why := budget.refuse_search(decided.plan, rungs, 3, "recompute")
    ):
        refused = Reason("recompute.not_weighed", why=why)
        return decided.replanned(Measured().decided(recompute=refused))
    if asked is None:
        search = search or SearchOptions(min_steps_per_epoch=AUTO_MIN_STEPS)
    else:
        search = check_options(search, asked * decided.plan.replicas)

    def searcher(
        plan: Plan, options: SearchOptions, **kwargs: Any
    ) -> BatchSearchResult:
        return _engine_search(
            _request(decided, given, plan, options, **{**run, **kwargs})
        )

    try:
        weighing = recompute_lib.weighed(decided, searcher, search, asked)
    except Exception as e:  # a model remat cannot trace: trains as planned
        why = Reason("recompute.weigh_failed", error=f"{type(e).__name__}: {gist(e)}")
        return decided.replanned(Measured().decided(recompute=why).warned(why))
    plan = weighing.plan
    return decided.replanned(
        Measured().decided(recompute=weighing.why),
        options=dataclasses.replace(
            decided.options, recompute=plan.recompute or "auto"
        ),
        recomputed=weighing,
        search=weighing.search if plan.recompute else result,
    )


def _request(
    decided: Decided,
    given: Given,
    plan: Plan,
    options: SearchOptions | None,
    **run: Any,
) -> SearchRequest:
    """The search for `plan` over `decided`'s facts."""
    run.setdefault("instance", decided.instance)
    run.setdefault("verbose", decided.options.verbose)
    return _request_for(given, decided.data, plan, decided.hardware, options, **run)


def _tried(
    decided: Decided,
    given: Given,
    ladder: bool,
    budget: budget_lib.RunBudget | None = None,
) -> Decided:
    """The decision after timing, on the real data, the CPU choices left to
    kerascale: the batch (the ladder's rungs), the pipeline, the precision,
    each where `budget`'s run is long enough to pay for it (None: no
    budget)."""
    options, plan, result = decided.options, decided.plan, decided.search
    hw, data = decided.hardware, decided.data
    try_pipeline, try_precision, over = trials_lib.wanted(
        options, plan, data, given.x, hw, result
    )
    found = Measured()  # the trials' reasons, and why a stage was not run
    if over is not None:
        found = found.noted("precision", f"trials skipped: {over}")
    rungs: dict[int, float] = {}
    if ladder and result.mode == "ladder":  # not XLA's search: no rungs
        rungs = {
            p.batch: p.samples_per_s or 0.0
            for p in result.probes
            if p.outcome == "ok" and p.batch <= result.per_replica_batch_size
        }
    if not (try_pipeline or try_precision or len(rungs) > 1):
        return decided if over is None else decided.replanned(found)
    measured = trials_lib.run(
        given,
        decided.data,
        plan,
        decided.hardware,
        try_pipeline=try_pipeline,
        try_precision=try_precision,
        batches=rungs,
        optimize=decided.optimize_data,
        verbose=options.verbose,
        fresh=options.remeasure,
        run_samples=budget.samples(plan) if budget is not None else None,
        unbudgeted=budget is None,
        first_speed=budget.speed if budget is not None else None,
    )
    if len(rungs) > 1:
        result = _batch_chosen(result, measured, rungs, plan.replicas)
    settled = dataclasses.replace(
        options,
        precision=measured.precision
        if measured.measured("precision")
        else options.precision,
        optimize_data=measured.optimize_data
        if measured.measured("data_changes")
        else options.optimize_data,
    )
    for field, tried in (("precision", try_precision), ("data_changes", try_pipeline)):
        if measured.measured(field):
            found = found.decided(**{field: measured.why(field)})
        elif tried and measured.skip_reason(field):
            found = found.noted(field, f"trials skipped: {measured.skip_reason(field)}")
    return decided.replanned(
        found,
        options=settled,
        search=result,
        optimize_data=measured.optimize_data
        if measured.measured("data_changes")
        else decided.optimize_data,
        trials=measured,
    )


def _batch_chosen(
    result: BatchSearchResult,
    measured: trials_lib.TrialResult,
    rungs: dict[int, float],
    replicas: int,
) -> BatchSearchResult:
    """The search's result with the batch the trials chose, or, where they
    did not time the rungs, the fastest by the probes' own (synthetic)
    speeds: the smallest within 3% of the best."""
    if measured.measured("batch"):
        batch, why = measured.batch, measured.why("batch")
    else:
        batch, why = fastest_small(rungs)
        skipped = measured.skip_reason("batch")
        if skipped:
            why = why.noted(f"trials skipped: {skipped}")
    return dataclasses.replace(
        result,
        per_replica_batch_size=batch,
        batch_size=batch * replicas,
        reasons={**result.reasons, "batch_size": why},
    )


def _settle_tpu(decided: Decided) -> Decided:
    """On a TPU, the decision over the strategy that starts its system: the
    core count is known only then (8 is assumed until then). Another count
    than the plan's is the ladder's `LateCoreCount`: decided again over it."""
    if decided.plan.strategy != "tpu":
        return decided
    dist = strategy_lib.build(decided.plan)
    if dist.num_replicas_in_sync != decided.plan.replicas:
        raise LateCoreCount(dist, dist.num_replicas_in_sync, decided.plan.replicas)
    return dataclasses.replace(decided, instance=dist)
