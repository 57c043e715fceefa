"""`Decided`: the plan and everything it was decided from, what
`measure.decide.decide` returns and `apply` carries out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kerascale.measure.result import BatchSearchResult
from kerascale.plan.measured import NOTHING, Measured
from kerascale.plan.options import Options
from kerascale.plan.plan import Plan
from kerascale.plan.planner import Planner
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

if TYPE_CHECKING:
    from kerascale.measure.trial_result import TrialResult
    from kerascale.measure.weighing import Weighing


@dataclasses.dataclass(frozen=True)
class Found:
    """What one stage of a decision found (`measure.stages`): findings
    only, never a plan.

    Attributes:
        measured: Reasons, notes and warnings, for the plan to state.
        settled: The decision's fields the stage settles, by name (`options`,
            `search`, `trials`...): the plan is made again from them.
        carried: What the stage leaves for a later one, by name.
    """

    measured: Measured = NOTHING
    settled: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    carried: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def moves_plan(self) -> bool:
        """Whether it measured or settled anything: the plan is made again."""
        return self.measured != NOTHING or bool(self.settled)

    @property
    def empty(self) -> bool:
        return not self.moves_plan and not self.carried


@dataclasses.dataclass(frozen=True)
class Decided:
    """The plan and everything it was decided from.

    Attributes:
        hardware: What is here.
        model: Facts about the model.
        data: Facts about the training data.
        plan: The plan.
        instance: The user's `tf.distribute.Strategy`, or None.
        options: The options the plan was made with ("auto" settled by
            trials where they ran).
        search: The batch search's result, where one ran.
        optimize_data: The pipeline decision, "auto" resolved.
        trials: The trials' result (`trials.TrialResult`), where they ran.
        recomputed: Recomputation weighed against accumulation
            (`measure.weighing.Weighing`), where memory bound the batch.
        search_skipped: Why a batch search that was wanted did not run
            ("" where it ran, or none was wanted).
        measured: What planning found beyond the rules, in the plan's
            reasons and warnings.
        host_path: The host's path between steps, timed
            (`measure.host_path.HostPath`), where it was.
        steps_in_run: The bounds within which the run chooses its steps
            per call (`apply.steps_in_run.Bounds`), where it does.
    """

    hardware: Hardware
    model: ModelFacts
    data: DataFacts
    plan: Plan
    instance: Any
    options: Options
    search: BatchSearchResult | None = None
    optimize_data: bool = True
    trials: TrialResult | None = None
    recomputed: Weighing | None = None
    search_skipped: str = ""
    measured: Measured = NOTHING
    host_path: Any = None
    steps_in_run: Any = None

    @property
    def planner(self) -> Planner:
        return Planner(self.hardware, self.model, self.data)

    def after(self, found: Found) -> Decided:
        """This decision after a stage's findings (`measure.stages.run`):
        its fields the stage settled, what it measured added, and its plan
        made again from its options, its search and everything measured (the
        one place a decision's plan is remade). As it was where the stage
        found nothing for the plan (what it carries is the loop's)."""
        if not found.moves_plan:
            return self
        decided = dataclasses.replace(
            self, measured=self.measured | found.measured, **found.settled
        )
        plan = decided.planner(
            decided.options, search=decided.search, measured=decided.measured
        )
        return dataclasses.replace(decided, plan=plan)

    @property
    def measured_here(self) -> bool:
        """Whether planning measured anything in this process (a search not
        read from the cache, trials, recomputation weighed): what leaves
        compiles' garbage and freed heap behind."""
        searched = self.search is not None and not self.search.cached
        tried = self.trials is not None and bool(self.trials.trials)
        timed = self.host_path is not None
        return searched or tried or timed or self.recomputed is not None
