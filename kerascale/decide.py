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
from kerascale.batch_search import BatchSearchResult, SearchOptions
from kerascale.hardware import Hardware
from kerascale.planning import DataFacts, ModelFacts, Options, Plan, make_plan

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


def needs_search(options: Options, data: DataFacts) -> bool:
    """ "auto" batch and data that does not bring its own batch."""
    return options.batch_size == "auto" and not data.batched


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
    if force_search or needs_search(options, data_facts):
        if search is None:
            search = SearchOptions(min_steps_per_epoch=AUTO_MIN_STEPS)
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
    elif search is not None and (search.memory_limit or search.max_batch_size):
        why = (
            f"batch_size={options.batch_size} was given"
            if options.batch_size != "auto"
            else f"your dataset brings its own batch of {data_facts.batch_size}"
        )
        plan = dataclasses.replace(
            plan,
            warnings=(
                *plan.warnings,
                f"memory_limit and max_batch_size bound the batch-size search, "
                f"which did not run: {why}.",
            ),
        )
    return Decided(hw, model_facts, data_facts, plan, instance, result)
