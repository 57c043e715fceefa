"""Gathering the facts and making the plan: shared by `fit`, `plan` and
`find_batch_size`.

The facts are the hardware, the model and the data; the plan is
`planning.make_plan` of them. When the batch is "auto" and the data does not
bring its own batch, the batch-size search runs between a first plan (which
fixes the strategy and precision the probes must use) and the final one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kerascale import batch_search
from kerascale import data as data_lib
from kerascale import hardware as hardware_lib
from kerascale import precision as precision_lib
from kerascale import trials as trials_lib
from kerascale.batch_search import BatchSearchResult, SearchOptions
from kerascale.errors import ConfigurationError
from kerascale.hardware import Hardware
from kerascale.planning import (
    DataFacts,
    ModelFacts,
    Options,
    Plan,
    make_plan,
    searched_batch,
)

# An "auto" batch leaves an epoch at least this many optimizer updates.
AUTO_MIN_STEPS = 8


@dataclasses.dataclass(frozen=True)
class Decided:
    hardware: Hardware
    model: ModelFacts
    data: DataFacts
    plan: Plan
    instance: Any  # the user's tf.distribute.Strategy, or None
    search: BatchSearchResult | None = None
    optimize_data: bool = True  # the pipeline decision, "auto" resolved
    trials: Any = None  # a trials.TrialResult, where trials ran


def needs_search(options: Options, data: DataFacts) -> bool:
    """ "auto" batch and data that does not bring its own batch."""
    return searched_batch(options, data)


def needs_check(
    options: Options, data: DataFacts, hw: Hardware, search: SearchOptions | None
) -> bool:
    """Whether a requested batch is checked against memory (and split with
    gradient accumulation if it does not fit): on GPUs and TPUs, whose memory
    is small and fixed, or wherever `memory_limit` is given; not when the
    split is already stated (accumulation_steps, max_batch_size) or the data
    makes its own batches (a PyDataset)."""
    if searched_batch(options, data) or data.kind == "pydataset":
        return False
    if options.accumulation_steps or options.max_batch_size:
        return False
    limit = search is not None and search.memory_limit
    return hw.accelerator in ("gpu", "tpu") or bool(limit)


def decide(
    model: Any,
    x: Any,
    y: Any,
    options: Options,
    *,
    steps_per_epoch: Any = None,
    search: SearchOptions | None = None,
    force_search: bool = False,
    hardware: Hardware | None = None,
    not_rebuildable: str = "",
) -> Decided:
    """Facts, then the plan; runs the batch-size search where it is needed.

    Args:
        model: The user's model or builder.
        x, y: The training data.
        options: Validated options.
        steps_per_epoch: For the infinite-dataset check.
        search: Batch-search options; defaults apply when None.
        force_search: Search even when the data brings its own batch
            (`find_batch_size`).
        hardware: Reuse a detection instead of detecting again.
        not_rebuildable: Why the model could not be re-created, when a first
            attempt failed.
    """
    data_facts = data_lib.inspect(x, y, steps_per_epoch=steps_per_epoch)
    model_facts = precision_lib.model_facts(
        model, options.strategy, sample=lambda: data_lib.sample_inputs(x, data_facts)
    )
    if not_rebuildable:
        model_facts = dataclasses.replace(
            model_facts, rebuildable=False, why_not_rebuildable=not_rebuildable
        )
    # Through the module, so that tests can replace the hardware seam.
    hw = hardware or hardware_lib.detect_hardware()
    instance = options.strategy if not isinstance(options.strategy, str) else None
    plan = make_plan(hw, options, model_facts, data_facts)
    result = None
    unused = ""
    can_try = trials_lib.possible(options, hw, model_facts)
    ladder = False
    if force_search or needs_search(options, data_facts):
        if search is None:
            search = SearchOptions(min_steps_per_epoch=AUTO_MIN_STEPS)
        if not force_search and search.mode == "auto" and can_try:
            # On a CPU the fastest batch depends on your input pipeline, which
            # synthetic probes do not run: the children find what fits, on a
            # ladder of batches, and trials time the rungs on the real data.
            search = dataclasses.replace(search, mode="ladder")
            ladder = True
        result = batch_search.run_search(
            model,
            x,
            y,
            data_facts,
            plan,
            hw,
            search,
            instance=instance,
            verbose=options.verbose,
        )
        plan = make_plan(hw, options, model_facts, data_facts, search=result)
    elif needs_check(options, data_facts, hw, search):
        # Does the requested batch fit in one forward pass? One probe if it
        # does; otherwise the largest micro-batch, for the accumulation split.
        # Probes carry accumulators (k=2): the split will need them.
        per_replica = plan.micro_batch_size
        check = dataclasses.replace(
            search or SearchOptions(),
            mode="max",
            max_batch_size=per_replica * plan.replicas,
            min_steps_per_epoch=1,
        )
        result = batch_search.run_search(
            model,
            x,
            y,
            data_facts,
            plan,
            hw,
            check,
            instance=instance,
            verbose=options.verbose,
            first=per_replica,
            accumulation_steps=2,
        )
        plan = make_plan(hw, options, model_facts, data_facts, search=result)
    elif search is not None and search.memory_limit:
        why = (
            "your PyDataset makes its own batches"
            if data_facts.kind == "pydataset"
            else "accumulation_steps or max_batch_size already states the split"
            if options.accumulation_steps or options.max_batch_size
            else f"your dataset brings its own batch of {data_facts.batch_size}"
        )
        unused = f"memory_limit was not used (nothing was probed): {why}."
    try_pipeline, try_precision = (
        trials_lib.wanted(options, plan, data_facts, x) if can_try else (False, False)
    )
    rungs = ()
    if ladder:
        rungs = tuple(
            p.batch
            for p in result.probes
            if p.outcome == "ok" and p.batch <= result.batch_size
        )
    measured = None
    optimize = options.optimize_data is not False
    if try_pipeline or try_precision or len(rungs) > 1:
        measured = trials_lib.run(
            model,
            x,
            y,
            data_facts,
            plan,
            hw,
            try_pipeline=try_pipeline,
            try_precision=try_precision,
            batches=rungs,
            optimize=optimize,
            verbose=options.verbose,
        )
        optimize = measured.optimize_data
        if len(rungs) > 1:
            result = dataclasses.replace(
                result,
                batch_size=measured.batch,
                global_batch_size=measured.batch * plan.replicas,
                reasons={**result.reasons, "batch_size": measured.why("batch")},
            )
        settled = dataclasses.replace(
            options,
            precision=measured.precision,
            optimize_data=optimize if try_pipeline else options.optimize_data,
        )
        plan = make_plan(hw, settled, model_facts, data_facts, search=result)
        reasons = dict(plan.reasons)
        if try_precision:
            reasons["precision"] = measured.why("precision")
        if try_pipeline:
            reasons["data_changes"] = measured.why("data_changes")
        plan = dataclasses.replace(plan, reasons=reasons)
    if unused:
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, unused))
    return Decided(
        hw, model_facts, data_facts, plan, instance, result, optimize, measured
    )


def agree(decided: Decided, options: Options) -> Decided:
    """The plan every worker of a cluster trains with.

    Each worker searched its own memory: all take the smallest batch any of
    them holds (so the global batch is the same everywhere and fits on every
    worker), and the chief's precision (workers with different devices could
    choose differently, and the replicas must compute alike). Needs
    `multiworker.connect()`; every worker calls it once per `fit`.
    """
    from kerascale import multiworker

    plan, result = decided.plan, decided.search
    peers = multiworker.exchange(
        {
            "batch": result.batch_size if result is not None else None,
            "precision": plan.precision,
            "global_batch_size": plan.global_batch_size,
        }
    )
    batches = [p["batch"] for p in peers if p["batch"] is not None]
    chief = peers[0]
    if all(p == chief for p in peers):
        return decided
    if not batches and len({p["global_batch_size"] for p in peers}) > 1:
        sizes = ", ".join(str(p["global_batch_size"]) for p in peers)
        raise ConfigurationError(
            f"The workers planned different global batches ({sizes}): give every "
            "worker the same arguments and the same data."
        )
    changes: dict[str, Any] = {}
    if chief["precision"] != plan.precision:
        changes["precision"] = chief["precision"]
    settled = dataclasses.replace(options, **changes)
    if result is not None:
        smallest = min(batches)
        why = (
            f"{result.reasons.get('batch_size', 'searched')}; the smallest of the "
            f"{len(peers)} workers' ({', '.join(str(b) for b in batches)} per replica)"
        )
        result = dataclasses.replace(
            result,
            batch_size=smallest,
            global_batch_size=smallest * plan.replicas,
            reasons={**result.reasons, "batch_size": why},
        )
    agreed = make_plan(
        decided.hardware, settled, decided.model, decided.data, search=result
    )
    if changes:
        reasons = {
            **agreed.reasons,
            "precision": f"the chief's ({chief['precision']}), so that all "
            "workers compute alike",
        }
        agreed = dataclasses.replace(agreed, reasons=reasons)
    return dataclasses.replace(decided, plan=agreed, search=result)
