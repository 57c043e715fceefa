"""Facts, measurements and the plan: shared by `fit`, `plan`, `diagnose` and
`find_batch_size`.

Its design: docs/design/modules.md, `kerascale.measure.decide`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from kerascale import _tf
from kerascale._keras_compat import leaves_no_trace
from kerascale.apply import strategy as strategy_lib
from kerascale.measure import batch_plan, cluster_plan, engines, first_step, host_path
from kerascale.measure import budget as budget_lib
from kerascale.measure import recompute as recompute_lib
from kerascale.measure import stages as stages_lib
from kerascale.measure import trials as trials_lib
from kerascale.measure.batch_plan import (
    AUTO_MIN_STEPS,
)
from kerascale.measure.decided import Decided, Found
from kerascale.measure.request import Given, SearchOptions
from kerascale.plan.fallback import LateCoreCount
from kerascale.plan.measured import Measured
from kerascale.plan.options import Options, pinned_reasons, user_instance
from kerascale.plan.planner import Planner
from kerascale.sense import data_facts, memory, samples
from kerascale.sense import hardware as hardware_lib
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import model_facts


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
    batch_plan.BatchSearched(),
    trials_lib.Trials(),
    recompute_lib.Recomputed(),
    host_path.StepsPerCall(),
    cluster_plan.Agreed(),
    Brought(),
    SettledTpu(),
)
# find_batch_size's: the search on its own, nothing weighed against a run.
SEARCH: tuple[stages_lib.Stage, ...] = (
    Sharding(),
    batch_plan.Searched(),
    trials_lib.Trials(after_search=True),
    recompute_lib.RecomputeBound(),
    Brought(),
    SettledTpu(),
)
