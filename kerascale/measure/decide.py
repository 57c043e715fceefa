"""Facts, measurements and the plan: shared by `fit`, `plan`, `diagnose` and
`find_batch_size`.

Its design: docs/design/modules.md, `kerascale.measure.decide`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from kerascale import _tf
from kerascale._keras_compat import leaves_no_trace
from kerascale.apply import strategy as strategy_lib
from kerascale.measure import batch as batch_lib
from kerascale.measure import budget as budget_lib
from kerascale.measure import engines, first_step, host_path
from kerascale.measure import recompute as recompute_lib
from kerascale.measure import request as request_lib
from kerascale.measure import stages as stages_lib
from kerascale.measure import trials as trials_lib
from kerascale.measure.batch_plan import (
    AUTO_MIN_STEPS,
    ProbeFailed,
    batch_for_plan,
    check_options,
    probeable,
)
from kerascale.measure.cluster_plan import agree
from kerascale.measure.decided import Decided, Found
from kerascale.measure.request import Given, SearchOptions, SearchRequest
from kerascale.measure.result import BatchSearchResult
from kerascale.plan.fallback import FailedInProbe, LateCoreCount
from kerascale.plan.measured import Measured
from kerascale.plan.options import Options, pinned_reasons, user_instance
from kerascale.plan.plan import Plan
from kerascale.plan.planner import Planner
from kerascale.plan.reasons import Reason
from kerascale.plan.rules import searched_batch
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
    stages: Sequence[stages_lib.Stage] | None = None,
    call: stages_lib.Call | None = None,
    search: SearchOptions | None = None,
    hardware: Hardware | None = None,
) -> Decided:
    """The one entrance to a decision: the facts, the first plan, then each
    of `stages` once, in order, through `measure.stages.run` (`FIT`: fit's,
    plan's and diagnose's; `SEARCH`: find_batch_size's). Each stage measures
    only where the run repays it, and the plan is made again from what it
    found. No stage retries: a failure that kerascale answers is raised as a
    `plan.fallback.Recoverable`, for the door's ladder.

    Args:
        model: The user's model or builder.
        x, y: The training data.
        options: Validated options.
        stages: The stages to run (None: `FIT`).
        call: What the door's call brings (`stages.Call`: the run's epochs,
            the ladder's attempt, a cluster, a resumed checkpoint's pins...);
            None: a call that brings nothing, and no run follows.
        search: Batch-search options; defaults apply when None.
        hardware: Reuse a detection instead of detecting again.

    Raises:
        plan.fallback.Recoverable: A failure that a rung of the ladder answers.
        BatchSizeSearchError: Under `SEARCH`, where the data or the model
            cannot be probed, or a probe fails.
    """
    call = call or stages_lib.Call()
    given = Given(model, x, y)
    planner = _facts(given, options, hardware, call)
    data = planner.data
    budget = None
    if call.epochs is not None and data.measurable:  # a run to weigh against
        budget = budget_lib.RunBudget(
            data,
            call.epochs,
            call.steps_per_epoch,
            lambda: first_step.train_seconds_per_sample(model, x, y, data),
        )
    first = Decided(
        planner.hardware,
        planner.model,
        data,
        planner(options),
        user_instance(options),
        options,
        optimize_data=options.optimize_data is not False,
    )
    at = stages_lib.At(first, given, search, budget, call)
    return stages_lib.run(FIT if stages is None else stages, at).decided


def _facts(
    given: Given, options: Options, hardware: Hardware | None, call: stages_lib.Call
) -> Planner:
    """The facts (hardware, model, data) that every plan of a decision is
    made over, with what an earlier attempt found of the model."""
    data = data_facts.inspect(
        given.x,
        given.y,
        steps_per_epoch=call.steps_per_epoch,
        validation_split=call.validation_split,
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
    attempt = call.attempt
    if attempt is not None and attempt.not_rebuildable:
        facts = facts.without_rebuild(attempt.not_rebuildable)
    if attempt is not None and attempt.unplaceable:
        facts = facts.without_placing(attempt.unplaceable)
    return Planner(hw, facts, data)


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


class Sharding(stages_lib.Priceless):
    """Whether one replica fits a device, else the mesh to shard over (JAX's
    `ModelParallel`; elsewhere the plan as it is): `engines.sharding`."""

    name = "sharding"

    def skip(self, at: stages_lib.At) -> Found | None:
        return None

    def measure(self, at: stages_lib.At) -> Found:
        decided, given = at.decided, at.given
        options, found = engines.sharding(decided.hardware.backend)(
            given.model, given.x, given.y, decided.options, decided.planner, at.search
        )
        if options == decided.options:
            return Found(found)
        return Found(found, {"options": options, "instance": user_instance(options)})


class BatchSearched(stages_lib.Priceless):
    """fit's batch: the search's answer for an "auto" one, the memory check of
    a requested one (`batch_plan.batch_for_plan`). On a CPU an "auto" batch
    is Keras's, and nothing is probed before the run (issue 78).

    A probe that fails for a reason other than memory is not fit's error to
    raise: under a mixed precision kerascale chose, it is the ladder's
    `FailedInProbe`; otherwise the search is dropped (the real run then
    raises the model's error, as `model.fit` would). Carries "asked" (the
    batch per replica asked for, None for "auto")."""

    name = "search"

    def skip(self, at: stages_lib.At) -> Found | None:
        return None

    def measure(self, at: stages_lib.At) -> Found:
        decided = at.decided
        hw, facts, data = decided.hardware, decided.model, decided.data
        options, plan = decided.options, decided.plan
        asked = None if searched_batch(options, data) else plan.micro_batch_size
        found, skipped, hint = Measured(), "", None
        try:
            result, note = batch_for_plan(
                at.given, options, decided.planner, plan, at.search
            )
        except request_lib.SearchSkipped as e:
            result, note, skipped, hint = None, "", str(e), e.hint
        except ProbeFailed as e:
            if options.precision == "auto" and plan.precision != facts.policy:
                raise FailedInProbe(
                    str(e), tried=plan.precision, policy=facts.policy
                ) from e
            result = None
            note = (
                f"No batch search: a probe failed for a reason other than memory "
                f"({e}). Training at Keras's default batch; pass batch_size= to "
                "choose."
            )
        found = found.warned(note)
        if skipped:
            hint = hint or _search_anyway(hw)
            found = found.noted(
                "global_batch_size", f"batch search skipped: {skipped}; {hint}"
            )
        settled = {"search": result, "search_skipped": skipped}
        return Found(found, settled, {"asked": asked})


class Searched(stages_lib.Priceless):
    """find_batch_size's search, whatever batch the data brings; its failures
    are the caller's errors (`BatchSizeSearchError`), and the pipeline is
    timed as given."""

    name = "search"

    def skip(self, at: stages_lib.At) -> Found | None:
        return None

    def measure(self, at: stages_lib.At) -> Found:
        decided = at.decided
        probeable(decided.model, decided.data, decided.hardware)
        request = _request(decided, at.given, decided.plan, at.search)
        skipped = ""
        try:
            result = _engine_search(request)
        except request_lib.SearchSkipped as e:  # no answer here: the caller says why
            result, skipped = None, str(e)
        settled = {"search": result, "search_skipped": skipped, "optimize_data": False}
        return Found(settled=settled)


class Trials(stages_lib.Priceless):
    """Timing, on the real data, the CPU choices left to kerascale before the
    run: the pipeline and the precision. Each trial is weighed by the gate
    inside the bench (`trial_bench.Bench.budget_for`: its price is known only
    once a first candidate is timed)."""

    name = "trials"

    def __init__(self, *, after_search: bool = False):
        self.after_search = after_search  # only where a search answered

    def skip(self, at: stages_lib.At) -> Found | None:
        decided = at.decided
        if self.after_search and decided.search is None:
            return Found()
        options, hw = decided.options, decided.hardware
        return None if trials_lib.possible(options, hw, decided.model) else Found()

    def measure(self, at: stages_lib.At) -> Found:
        decided, given, budget = at.decided, at.given, at.budget
        options, plan = decided.options, decided.plan
        try_pipeline, try_precision, over = trials_lib.wanted(
            options, plan, decided.data, given.x, decided.hardware, decided.search
        )
        found = Measured()  # the trials' reasons, and why a stage was not run
        if over is not None:
            found = found.noted("precision", f"trials skipped: {over}")
        if not (try_pipeline or try_precision):
            return Found(found)
        measured = trials_lib.run(
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
        for field, wanted in tried:
            if measured.measured(field):
                found = found.decided(**{field: measured.why(field)})
            elif wanted and measured.skip_reason(field):
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


class Recomputed:
    """Recomputation weighed against accumulation where memory binds the
    batch (`recompute.weighed`), where the run repays it. A weighing that
    fails is dropped with a warning: the plan trains as it was."""

    name = "recompute"

    def skip(self, at: stages_lib.At) -> Found | None:
        decided = at.decided
        if decided.options.recompute != "auto":
            return Found()
        if not recompute_lib.binding(decided, at.carried.get("asked")):
            return Found()
        return None

    def price(self, at: stages_lib.At) -> budget_lib.Price | None:
        if at.budget is None:
            return None
        plan, result = at.decided.plan, at.decided.search
        rungs = [p.batch for p in result.probes] + [plan.micro_batch_size] * 2
        return at.budget.search_price(plan, rungs, 3, "recompute")

    def refused(self, at: stages_lib.At, why: str) -> Found:
        refused = Reason("recompute.not_weighed", why=why)
        return Found(Measured().decided(recompute=refused))

    def measure(self, at: stages_lib.At) -> Found:
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
            return _engine_search(
                _request(decided, given, plan, options, **{**run, **kwargs})
            )

        try:
            weighing = recompute_lib.weighed(decided, searcher, search, asked)
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


class RecomputeBound(stages_lib.Priceless):
    """find_batch_size's result with the bound under recomputation beside
    the bound without, where memory stopped the search and recomputation is
    not off. A search for it that fails is said in the result's reasons: the
    bound found stands."""

    name = "recompute"

    def skip(self, at: stages_lib.At) -> Found | None:
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

    def measure(self, at: stages_lib.At) -> Found:
        decided, result = at.decided, at.decided.search
        plan = dataclasses.replace(decided.plan, recompute=recompute_lib.MODE)
        request = _request(
            decided, at.given, plan, at.search, host_share=result.host_share
        )
        try:
            found = _engine_search(request)
        except Exception as e:  # an optional figure: the bound found stands
            error = f"{type(e).__name__}: {gist(e)}"
            why = Reason("recompute.weigh_failed", error=error)
            said = dataclasses.replace(
                result, reasons={**result.reasons, "recompute": why}
            )
            return Found(settled={"search": said})
        return Found(settled={"search": recompute_lib.reported(result, found)})


class Agreed(stages_lib.Priceless):
    """On a cluster, the plan every worker trains with (`cluster_plan.agree`)."""

    name = "agree"

    def skip(self, at: stages_lib.At) -> Found | None:
        return None if at.call.clustered else Found()

    def measure(self, at: stages_lib.At) -> Found:
        return agree(at.decided)


class Brought(stages_lib.Priceless):
    """What the run brings, added last: a materialized input, what earlier
    attempts found, a resumed checkpoint's pins."""

    name = "brought"

    def skip(self, at: stages_lib.At) -> Found | None:
        return None

    def measure(self, at: stages_lib.At) -> Found:
        call = at.call
        brought = Measured(materialized=call.materialized)
        if call.attempt is not None:
            brought = brought | call.attempt.measured
        if call.pinned:
            brought = Measured().decided(**pinned_reasons(call.pinned)) | brought
        return Found(brought)


class SettledTpu(stages_lib.Priceless):
    """On a TPU, the decision over the strategy that starts its system: the
    core count is known only then (8 is assumed until then). Another count
    than the plan's is the ladder's `LateCoreCount`: decided again over it."""

    name = "tpu"

    def skip(self, at: stages_lib.At) -> Found | None:
        return None if at.decided.plan.strategy == "tpu" else Found()

    def measure(self, at: stages_lib.At) -> Found:
        plan = at.decided.plan
        dist = strategy_lib.build(plan)
        if dist.num_replicas_in_sync != plan.replicas:
            raise LateCoreCount(dist, dist.num_replicas_in_sync, plan.replicas)
        return Found(settled={"instance": dist})


# fit's, plan's and diagnose's stages, in order; the steps per call and the
# cluster's agreement only where a run follows or a cluster was joined.
FIT: tuple[stages_lib.Stage, ...] = (
    Sharding(),
    BatchSearched(),
    Trials(),
    Recomputed(),
    host_path.StepsPerCall(),
    Agreed(),
    Brought(),
    SettledTpu(),
)
# find_batch_size's: the search on its own, nothing weighed against a run.
SEARCH: tuple[stages_lib.Stage, ...] = (
    Sharding(),
    Searched(),
    Trials(after_search=True),
    RecomputeBound(),
    Brought(),
    SettledTpu(),
)
