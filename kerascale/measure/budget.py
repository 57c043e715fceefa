"""The one gate: whether a measurement pays for itself in the run it tunes.

Each measurement declares its `Price` (what it would cost, the run it tunes,
the share of it that it may save) and `refused` says why it does not pay, or
None; the tuned figures it reads (`REPAY`, `GAINS`, a child's and a rung's
cost) live here. The decision's loop asks it of every priced stage
(`measure.stages.entered`), and the trials of each trial once a first
speed is known (`trial_bench.Bench`).

Its design: docs/design/modules.md, `kerascale.measure.budget`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kerascale.measure.probe import MIN_TIMED_SECONDS
from kerascale.measure.search import LADDER_CHUNK

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts

# A measurement runs where its expected saving is at least REPAY x its cost
# (tests set 0: always; inf: never).
REPAY = 1.0
# What a measurement is expected to save, as a share of the run it tunes,
# before it runs (2 cores, AMD EPYC with AVX512-BF16; benchmarks/end_to_end.py
# and jax_end_to_end.py):
# - "data_changes": the optimised pipeline is kept without the trial; the
#   trial saves only where it is slower than the pipeline as given: 3%
#   (2812 against 2717 samples/s, issue 39), under 5% on bn.
# - "precision": the rule's precision (float32 on a CPU) is kept without the
#   trial; the trial saves where bf16 is faster. XLA's CPU bf16 ran the
#   reference CNN 0.85x float32 and issue 78's four models 0.45-1.0x, never
#   faster (JAX: 0.02, so that only a long run pays for the check: the
#   5-minute jax_wall_time.py run spent 9 s of trials to keep float32).
#   TensorFlow's oneDNN bf16 ran them 0.6-1.55x: the reference CNN
#   1.55x (2,430 against 2,030 samples/s in the trials, 11 against 17 ms a
#   step), a Conv1D 1.1-1.4x, two MLPs 0.6-0.8x, two CNNs 0.95-1.0x, bn about
#   1.0x: a saving of about 0.09 over those seven, taken as 0.10.
# - "recompute": weighed only where memory binds the batch; recomputation
#   against accumulation moved the step time 10-30% (benchmarks/remat.py).
GAINS = {
    "tensorflow": {
        "data_changes": 0.03,
        "precision": 0.10,
        "recompute": 0.10,
    },
    "jax": {
        "data_changes": 0.03,
        "precision": 0.02,
        "recompute": 0.10,
    },
}
NAMES = {
    "data_changes": "the pipeline trials",
    "precision": "the precision trials",
    "recompute": "the weighing",
    "steps_per_execution": "timing the host's path",
}
# A search's rungs in child processes (2 cores, the quickstart: a child's
# start, TensorFlow's import and the first trace 2.5-3 s; each further rung of
# the same child 0.5 s beyond its timed steps): what weighing recomputation
# costs.
CHILD_START_SECONDS = 2.5
RUNG_SECONDS = 0.5


class RunBudget:
    """The run kerascale's measurements are weighed against: `epochs` of
    the training data (`data`, or `steps_per_epoch` steps), at a first speed
    that `estimate` (seconds per trained sample, or None) gives once, when a
    measurement first needs it."""

    def __init__(
        self,
        data: DataFacts,
        epochs: int,
        steps_per_epoch: Any,
        estimate: Callable[[], float | None],
    ):
        self.data, self.epochs, self.steps_per_epoch = data, epochs, steps_per_epoch
        self._estimate = estimate

    def samples(self, plan: Plan) -> int | None:
        """The samples the run trains under `plan`; None when unknown."""
        steps = self.steps_per_epoch
        if isinstance(steps, int) and steps > 0:
            return self.epochs * steps * plan.global_batch_size
        if self.data.num_samples:
            return self.epochs * self.data.num_samples
        return None

    @functools.cached_property
    def per_sample(self) -> float | None:
        return self._estimate()

    def speed(self) -> float | None:
        """The first estimate's samples/s, or None."""
        return 1 / self.per_sample if self.per_sample else None

    def search_price(
        self,
        plan: Plan,
        rungs: list[int],
        steps: int,
        what: str,
        *,
        in_children: bool = True,
    ) -> Price | None:
        """What probing the batches `rungs` would cost a run under `plan`
        (its batch is what the run would train at without them), and may
        save; None when the run's length or a first step time is unknown
        (then they are probed, as a run that may be long). `what`: the
        measurement (a `GAINS` key), for its expected gain; `in_children`:
        whether its rungs start child processes."""
        samples = self.samples(plan)
        if samples is None or self.per_sample is None:
            return None
        cost = search_seconds(rungs, self.per_sample, steps, in_children=in_children)
        return Price(what, cost, samples * self.per_sample, gain(what, plan.backend))


@dataclasses.dataclass(frozen=True)
class Price:
    """What a measurement would cost and may save, before it runs.

    Attributes:
        what: The measurement (a `NAMES` key), for the words.
        cost: Its expected seconds.
        run_seconds: The run it tunes, at the first estimate's speed.
        share: The share of that run it is expected to save.
    """

    what: str
    cost: float
    run_seconds: float
    share: float

    @property
    def saving(self) -> float:
        """Seconds it is expected to save, less its cost (`value`)."""
        return value(self.cost, self.run_seconds, self.share)


def search_seconds(
    rungs: list[int], per_sample: float, steps: int, *, in_children: bool = True
) -> float:
    """What probing `rungs` is expected to cost: a child per LADDER_CHUNK rungs (none
    when not `in_children`), each rung tracing, timing `steps` steps (at
    least MIN_TIMED_SECONDS) and validating."""
    children = math.ceil(len(rungs) / LADDER_CHUNK) if in_children else 0
    each = sum(
        RUNG_SECONDS + max(MIN_TIMED_SECONDS, steps * b * per_sample) + b * per_sample
        for b in rungs
    )
    return children * CHILD_START_SECONDS + each


def refused(price: Price) -> str | None:
    """The gate: why a measurement at `price` does not pay for itself in the
    run it tunes, or None where it does."""
    return unpaid(price.cost, price.run_seconds, price.share, price.what)


def refused_in_steps(
    least: int, run_steps: float, share: float, what: str
) -> str | None:
    """The gate counted in steps rather than seconds, where no step time is
    known yet: why a measurement that trains at least `least` steps cannot
    repay itself in a run of `run_steps` steps whatever a step takes, or
    None."""
    if value(least, run_steps, share) >= 0:
        return None
    return (
        f"{NAMES.get(what, what)} would train at least {least} steps; they may "
        f"save {share:.0%} of a run of about {run_steps:.0f} steps"
    )


def gain(what: str, backend: str) -> float:
    """The share of the run `what` is expected to save before it runs."""
    return GAINS.get(backend, GAINS["tensorflow"])[what]


def value(cost: float, run_seconds: float, share: float) -> float:
    """Seconds a measurement is expected to save, less its cost."""
    return share * run_seconds - REPAY * cost


def unpaid(cost: float, run_seconds: float, share: float, what: str) -> str | None:
    """Why a measurement costing `cost` seconds, expected to save `share` of
    a run of `run_seconds`, is not worth it, or None when it is; `what`
    names it (a `GAINS` key)."""
    if value(cost, run_seconds, share) >= 0:
        return None
    return (
        f"{NAMES.get(what, what)} would take about {_seconds(cost)}; it may "
        f"save {share:.0%} of a run of about {_seconds(run_seconds)}"
    )


def _seconds(s: float) -> str:
    return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
