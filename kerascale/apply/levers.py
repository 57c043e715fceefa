"""The levers a run's controller holds, assembled from the decision: the
steps per call (`steps_in_run`, where the plan leaves them to the run) and
the batch (`batch_growth`, where it may grow). `fit` only wires what this
returns, and writes the run's own choices into the plan it hands back.

Its design: docs/design/modules.md, `kerascale.apply.controller`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kerascale.apply import batch_growth
from kerascale.apply.controller import Controller, Lever
from kerascale.apply.steps_in_run import Bounds, StepsInRun
from kerascale.errors import warn
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason


@dataclasses.dataclass
class Levers:
    """The run's controller (None where no lever acts), its steps lever,
    and the plan's reason for the batch (`batch_growth.lever_for`)."""

    controller: Controller | None
    steps: StepsInRun | None
    batch_why: Reason | None

    def chosen(self, plan: Plan) -> Plan:
        """`plan` with the steps per call the run ended at, and how."""
        if self.steps is None:
            return plan
        n, why = self.steps.outcome()
        reasons = {**plan.reasons, "steps_per_execution": why}
        return dataclasses.replace(plan, steps_per_execution=n, reasons=reasons)


def assembled(
    facts: batch_growth.Facts,
    x: Any,
    y: Any,
    plan: Plan,
    steps_bounds: Bounds | None,
    *,
    say: Callable[[str], Any] | None,
    counters: tuple[Any, ...] = (),
    arguments: dict[str, Any] | None = None,
) -> Levers:
    """The levers for a run under `plan` (the plan that trains), and one
    controller over them and `facts`' callbacks. `steps_bounds`: where the
    run chooses its steps per call (`Decided.steps_in_run`); `counters`:
    callbacks that count samples by their `batch_size`, which follow it;
    `arguments`: the first `fit`'s, which a resumed grown batch joins."""
    levers: list[Lever] = []
    steps = None
    if steps_bounds is not None:
        steps = StepsInRun(steps_bounds, plan.backend, say=say)
        levers.append(steps)
    saved = facts.backup.saved_levers().get("batch") if facts.backup else None
    growth, why = batch_growth.lever_for(
        facts, x, y, plan, say=say, saved=saved, pace=steps
    )
    if growth is not None:
        levers.append(growth)
        if facts.backup is not None:
            _checkpointed(growth, why, facts.backup, saved, arguments)
    if not levers:
        return Levers(None, None, why)
    controller = Controller(levers, facts.callbacks)
    if growth is not None:
        batch_growth.followed(controller, counters)
    return Levers(controller, steps, why)


def _checkpointed(
    growth: batch_growth.BatchGrowth,
    why: Reason | None,
    backup: Any,
    saved: dict[str, Any] | None,
    arguments: dict[str, Any] | None,
) -> None:
    """`backup` (the run's `FaultTolerantBackup`) keeps `growth`'s state in
    each checkpoint, and a resumed run goes on from `saved` (the state in
    the one it resumes): its batch, into `arguments` (the first `fit`'s),
    and its learning rate's factor (the rate is the optimizer's state)."""
    resumed = growth.resumed(saved) if saved else {}
    if arguments is not None:
        arguments.update(resumed)
    if resumed and growth.stopped and why is not None:
        warn(
            f"Resuming at batch {resumed['batch_size']}, the checkpoint's "
            f"(its run grew the batch), with its learning rate; {why}."
        )
    elif resumed and growth.say is not None:
        growth.say(
            f"kerascale: the batch resumes at {growth.batch}, the "
            f"checkpoint's (grown from {growth.base} in the run), with "
            f"its learning rate (x{growth.factor:.3g} of yours)"
        )
    backup.levers["batch"] = growth.state
