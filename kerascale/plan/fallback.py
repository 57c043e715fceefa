"""The one fallback ladder: after the first training step failed, the
options of the next attempt, from the options, the plan that failed and
the failure (`after_first_step`). `fit` tries the decision, then at most
this one fallback; the error of a step that fails without kerascale's
choices is the model's own, raised as `model.fit` raises it."""

from __future__ import annotations

import dataclasses
from typing import Any

from kerascale.plan.measured import Measured
from kerascale.plan.options import Options
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason
from kerascale.sense.model_facts import gist


@dataclasses.dataclass(frozen=True)
class Fallback:
    """The next attempt.

    Attributes:
        options: Its options: the failed choice made plain `fit`'s, or the
            batch bounded below the one that ran out of memory.
        measured: Why, for its plan's reasons and warnings.
    """

    options: Options
    measured: Measured


# Where the plan's fields are set by an option of that name.
_FIELDS = {
    "strategy": "strategy",
    "precision": "precision",
    "optimize_data": "data_changes",
    "recompute": "recompute",
}


def after_first_step(
    options: Options,
    plan: Plan,
    model_policy: str,
    *,
    searched: bool,
    out_of_memory: bool,
    error: BaseException,
) -> Fallback | None:
    """The attempt after `plan` failed at its first training step with
    `error`, or None where nothing failed that kerascale chose (the error is
    then the model's own).

    A batch kerascale searched (`searched`) that ran out of memory steps
    down; otherwise the choices kerascale made on its own (precision,
    recomputation, several devices, the pipeline) become plain `fit`'s."""
    failure = f"{type(error).__name__}: {gist(error)}"
    if searched and out_of_memory:
        smaller = smaller_batch(options, plan)
        if smaller is not None:
            bounded, why = smaller
            return Fallback(bounded, Measured().warned(f"{why} ({failure})"))
    plainer, what = plain(options, plan, model_policy)
    if not what:
        return None
    # The arguments that skip each attempt, as the user writes them.
    skip: dict[str, Any] = {
        "strategy": plainer.strategy,
        "precision": plainer.precision,
        "optimize_data": plainer.optimize_data,
        "recompute": False,
    }
    changed = [k for k in _FIELDS if getattr(plainer, k) != getattr(options, k)]
    why = Reason(
        "first_step_failed",
        what=what,
        failure=failure,
        skip={k: skip[k] for k in changed},
    )
    measured = Measured().decided(**{_FIELDS[k]: why for k in changed}).warned(why)
    return Fallback(plainer, measured)


def plain(options: Options, plan: Plan, model_policy: str) -> tuple[Options, str]:
    """`options` with the choices kerascale made on its own, in `plan`, set
    to what plain `model.fit` does (the model's own precision, the data as
    given); and those choices, in words ("" when there are none)."""
    changes: dict[str, Any] = {}
    said = []
    if options.precision == "auto" and plan.precision != model_policy:
        changes["precision"] = model_policy
        said.append(f"precision {plan.precision}")
    if options.recompute == "auto" and plan.recompute:
        changes["recompute"] = "off"
        said.append("recomputation")
    if (
        options.strategy == "auto"
        and plan.strategy in ("data_parallel", "mirrored")
        and plan.replicas == len(plan.devices) > 1  # one process, one machine
    ):
        changes["strategy"] = "default"
        said.append(f"training over {plan.replicas} devices")
    pipeline = plan.data_changes.pipeline
    if options.optimize_data == "auto" and pipeline:
        changes["optimize_data"] = False
        said.append(f"the input pipeline changes ({', '.join(pipeline)})")
    return dataclasses.replace(options, **changes), " and ".join(said)


# Where the batch the search chose ran out of memory at the first real step,
# the next attempt's bound, as a share of it.
STEP_DOWN = 0.9


def smaller_batch(options: Options, plan: Plan) -> tuple[Options, str] | None:
    """`options` bounding the batch below `plan`'s (at `STEP_DOWN` of its
    micro-batch), for when the batch kerascale chose ran out of memory at the
    first step; None where the batch was not kerascale's to choose."""
    if options.batch_size != "auto" or options.max_batch_size:
        return None
    per_replica = max(1, int(plan.micro_batch_size * STEP_DOWN))
    if per_replica >= plan.micro_batch_size:
        return None
    bound = per_replica * plan.replicas
    why = (
        f"the batch of {plan.micro_batch_size} per replica that kerascale chose ran "
        f"out of memory at the first training step: stepped down to at most "
        f"{per_replica}"
    )
    return dataclasses.replace(options, max_batch_size=bound), why
