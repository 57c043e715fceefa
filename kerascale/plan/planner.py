"""`Planner`: the one place a plan is made, from the options and what was
measured (`plan.measured.Measured`), over one set of facts."""

from __future__ import annotations

import dataclasses

from kerascale.plan.measured import NOTHING, Measured, SearchAnswer
from kerascale.plan.options import Options
from kerascale.plan.plan import Plan
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts


@dataclasses.dataclass(frozen=True)
class Planner:
    """`make_plan` over one set of facts: every plan kerascale makes, the
    candidates its measurements time and the one that trains, is made here,
    from the options and what was measured."""

    hardware: Hardware
    model: ModelFacts
    data: DataFacts

    def __call__(
        self,
        options: Options,
        *,
        search: SearchAnswer | None = None,
        measured: Measured = NOTHING,
    ) -> Plan:
        return make_plan(
            self.hardware,
            options,
            self.model,
            self.data,
            search=search,
            measured=measured,
        )
