"""The decision as one loop over declared stages (issue 82).

Every measurement stage has one shape (`Stage`): what it finds without
measuring where it has nothing to measure (`skip`), what measuring would cost
and may save (`price`, for the one gate: `budget.refused`), what it
finds where the gate refuses it (`refused`), and what it measures
(`measure`). A stage returns findings (`decided.Found`): reasons, warnings and
the decision's fields it settles, never a plan. `run` walks a list of stages,
asks the gate, and makes the plan again from each stage's findings: the one
place a decision's plan is remade. No stage calls another; what one leaves
for a later one travels in `At.carried`.

`decide.FIT` (fit, plan, diagnose) and `decide.SEARCH` (find_batch_size) are
the two lists. A stage that joins later is one class and one line in a list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kerascale.measure import budget
from kerascale.measure.budget import Price
from kerascale.measure.decided import Decided, Found

if TYPE_CHECKING:
    from kerascale.measure.budget import RunBudget
    from kerascale.measure.request import Given, SearchOptions


@dataclasses.dataclass(frozen=True)
class Call:
    """What the door's call brings to its decision, for the stages to read.

    Attributes:
        epochs: The epochs the run trains (None: nothing trains after the
            decision, `diagnose` and `find_batch_size`).
        steps_per_epoch: `fit`'s: for the infinite-dataset check and the
            run's length.
        validation_split: `fit`'s: arrays train on the samples it leaves.
        steps_limit: The bounds the run's callbacks put on an "auto" steps
            per call (`plan.steps.StepsLimit`), or None.
        clustered: This process joined a cluster: all workers agree.
        attempt: The ladder's attempt (`plan.fallback.Attempt`), or None.
        pinned: Options set from a resumed checkpoint's plan.
        materialized: Where the input was materialized to, or "".
    """

    epochs: int | None = None
    steps_per_epoch: Any = None
    validation_split: Any = None
    steps_limit: Any = None
    clustered: bool = False
    attempt: Any = None
    pinned: tuple[str, ...] = ()
    materialized: str = ""


@dataclasses.dataclass(frozen=True)
class At:
    """Where a decision stands between two stages.

    Attributes:
        decided: The decision so far (its plan made from everything found).
        given: The user's model and data.
        search: The batch search's options (None: defaults).
        budget: The run the measurements are weighed against (None: none,
            every measurement that is wanted runs).
        call: What the door's call brings.
        carried: What a stage left for a later one, by name (the search's
            "asked": the batch per replica asked for, which recomputation is
            weighed against).
    """

    decided: Decided
    given: Given
    search: SearchOptions | None
    budget: RunBudget | None
    call: Call
    carried: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Stage(Protocol):
    """One measurement stage of a decision."""

    name: str

    def skip(self, at: At) -> Found | None:
        """What the stage finds without measuring (`Found()`: nothing), or
        None where it measures."""

    def price(self, at: At) -> Price | None:
        """What measuring would cost and may save, for the gate; None where
        there is nothing to weigh (it costs nothing, or it is always run)."""

    def refused(self, at: At, why: str) -> Found:
        """What the stage finds where the gate refused it (`why`)."""

    def measure(self, at: At) -> Found:
        """What the stage measured."""


class Priceless:
    """A stage that is never weighed: it always runs where wanted."""

    def price(self, at: At) -> Price | None:
        return None

    def refused(self, at: At, why: str) -> Found:  # never called
        raise AssertionError(f"{type(self).__name__} has no price to refuse")


def entered(stage: Stage, at: At) -> Found:
    """What `stage` finds at `at`: skipped, refused by the gate, or measured.
    The seam tests_common/attempts.py counts each stage's entries through."""
    found = stage.skip(at)
    if found is not None:
        return found
    price = stage.price(at)
    why = budget.refused(price) if price is not None else None
    return stage.refused(at, why) if why else stage.measure(at)


def run(stages: Sequence[Stage], at: At) -> At:
    """`at` after each of `stages` in turn, the plan made again from what
    each found (where it found anything)."""
    for stage in stages:
        found = entered(stage, at)
        if not found.empty:
            carried = {**at.carried, **found.carried}
            at = dataclasses.replace(
                at, decided=at.decided.after(found), carried=carried
            )
    return at
