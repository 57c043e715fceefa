"""The host's path between training steps, timed, and the steps per call
(Keras's `steps_per_execution`) that make it a small share of a step.

Between two steps Keras's `fit` goes back to Python: it takes the next
batch, calls the compiled function, and runs the callbacks' batch hooks.
Where a step is short that path is a large share of it; `compile(
steps_per_execution=N)` pays it once per N steps. Keras 3 has no automatic
value. Here a copy of the model (or the model itself, borrowed and put back)
trains on the real data at one step a call and at `k` a call, in
interleaved windows; the host's share per call is

    h = (t1 - tk) * k / (k - 1)        (t1, tk: seconds a step)

and, where it is at least `MIN_SHARE` of a step, the run takes the largest
value its bounds allow (`plan.steps`): a call under `MAX_CALL_SECONDS` and a
quarter of an epoch, landing on the steps the run's callbacks name. It runs
only where the run repays it (`budget`), before training.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from kerascale.apply import model as model_lib
from kerascale.apply import steps as steps_lib
from kerascale.apply import steps_in_run
from kerascale.apply.session import Session
from kerascale.measure import budget as budget_lib
from kerascale.measure import stages, trial_bench
from kerascale.measure.decided import Found
from kerascale.measure.probe import StepClock
from kerascale.measure.request import Given
from kerascale.plan import steps as steps_rules
from kerascale.plan.measured import Measured
from kerascale.plan.reasons import Reason
from kerascale.sense.model_facts import gist

if TYPE_CHECKING:
    from kerascale.measure.decided import Decided

# Below this share of a step, the host's path is left as Keras has it: the
# gain would be within the windows' noise (2-5% on 2 cores).
MIN_SHARE = 0.05
# The steps a call of the timed comparison (at most the run's own bound).
K = 16
WINDOW_SECONDS = 0.25
MIN_CALLS = 4  # in a window
WARM_CALLS = 2  # a window's first calls (a new iterator; the trace at k)
ROUNDS = 2  # each value timed twice, interleaved; the faster window counts
# What the comparison costs before it is timed: a copy prepared and warmed
# (the trials' guess), a second trace at k.
PREPARE_SECONDS = trial_bench.PREPARE_GUESS_SECONDS
TRACE_SECONDS = 0.5
# The host's path per call before it is timed, for the budget's expected
# gain (2 cores, the issue 59 MLP, plain fit: TensorFlow 0.6 ms, JAX 0.3 ms).
HOST_GUESS = {"tensorflow": 6e-4, "jax": 3e-4}


@dataclasses.dataclass(frozen=True)
class HostPath:
    """The timed comparison: seconds a step at one step a call (`t1`) and
    at `k` a call (`tk`)."""

    t1: float
    tk: float
    k: int

    @property
    def per_call(self) -> float:
        """The host's seconds per call (at least 0)."""
        return max(0.0, (self.t1 - self.tk) * self.k / (self.k - 1))

    @property
    def share(self) -> float:
        """The host's share of a step at one step a call."""
        return min(1.0, self.per_call / self.t1) if self.t1 > 0 else 0.0


class StepsPerCall:
    """The stage that chooses the steps per call where they are "auto" (and
    the model was compiled with 1): left to the run where it can move them
    at an epoch's end (`_in_run`), else measured before it where the run
    repays it, else 1 with why. A measurement that fails leaves 1, with why.
    A value of yours is checked against what counts each call's steps
    (`_yours`). Only where a run follows (`Call.epochs`)."""

    name = "steps_per_call"

    def skip(self, at: stages.At) -> Found | None:
        decided, call = at.decided, at.call
        options, plan = decided.options, decided.plan
        if call.epochs is None or steps_rules.held_by_replicas(
            plan.backend, plan.replicas
        ):
            return Found()  # nothing trains after; or the rule's 1
        if (
            options.steps_per_execution != "auto"
            or decided.model.steps_per_execution > 1
        ):
            return _yours(decided, call.steps_limit, call.steps_per_epoch)
        limit, epoch = _bounds(at)
        cluster = decided.hardware.cluster
        on_cluster = call.clustered or (cluster is not None and cluster.is_multi_worker)
        why = _why_not(decided, limit, epoch, on_cluster)
        if why is not None:
            return _one(decided, why)
        if not isinstance(call.steps_per_epoch, int) and not limit.counts_steps:
            return _in_run(decided, limit, epoch)
        # Where the run cannot move it at an epoch's end (an iterator that
        # runs on across epochs; a backup whose save points count the calls),
        # the value is timed before the run, on a copy, where the run repays it.
        return None

    def price(self, at: stages.At) -> budget_lib.Price | None:
        """What timing the host's path would cost, against what it may save;
        None where the run's length or speed is unknown."""
        budget, plan = at.budget, at.decided.plan
        if budget is None:
            return None
        samples = budget.samples(plan)
        if samples is None or budget.per_sample is None:
            return None
        host = HOST_GUESS.get(plan.backend, HOST_GUESS["tensorflow"])
        step = budget.per_sample * plan.step_batch_size
        cost = PREPARE_SECONDS + TRACE_SECONDS + 2 * ROUNDS * WINDOW_SECONDS
        run = samples * budget.per_sample
        return budget_lib.Price("steps_per_execution", cost, run, host / (host + step))

    def refused(self, at: stages.At, why: str) -> Found:
        return _one(at.decided, f"not measured: {why}")

    def measure(self, at: stages.At) -> Found:
        decided = at.decided
        limit, epoch = _bounds(at)
        try:
            found = _timed(decided, at.given, min(K, _cap(epoch, limit, decided.plan)))
        except model_lib.CannotRecreate as e:
            return _one(decided, f"not measured: the model cannot be copied ({e})")
        except Exception as e:  # an optional figure: the run keeps Keras's 1
            return _one(decided, f"not measured: {type(e).__name__}: {gist(e)}")
        n, why = _from_timing(found, epoch, limit, decided.plan)
        chosen = _decided(decided, n, why)
        return dataclasses.replace(
            chosen, settled={**chosen.settled, "host_path": found}
        )


def _bounds(at: stages.At) -> tuple[steps_rules.StepsLimit, int | None]:
    """The bounds on an "auto" value (the run's callbacks', and a divisor of
    `steps_per_epoch` where given: one iterator runs on across epochs, and
    Keras runs a call whole past the epoch's end), and the epoch's steps."""
    steps_per_epoch = at.call.steps_per_epoch
    limit = at.call.steps_limit or steps_rules.StepsLimit()
    if isinstance(steps_per_epoch, int) and steps_per_epoch > 0:
        limit = limit.dividing(steps_per_epoch, f"steps_per_epoch={steps_per_epoch}")
    return limit, _epoch_steps(at.decided, steps_per_epoch)


def _from_timing(
    found: HostPath,
    epoch: int | None,
    limit: steps_rules.StepsLimit,
    plan: Any,
) -> tuple[int, Reason]:
    """The steps per call the timing asks for, within the bounds, and why:
    the largest value the bounds allow (`steps_in_run.Bounds`, as the run's
    own choice takes it) where the host's share is at least `MIN_SHARE`,
    else 1."""
    figures = dict(share=found.share, t1=found.t1 * 1e3, tk=found.tk * 1e3, k=found.k)
    if found.share < MIN_SHARE:
        return 1, Reason("steps.not_worth", **figures)
    by_time = max(1, int(steps_rules.MAX_CALL_SECONDS / max(found.tk, 1e-9)))
    cap, why = _capped(epoch, limit, plan)
    bounds = steps_in_run.Bounds(cap, why, limit, plan.accumulation_steps)
    n, bound = bounds.largest(by_time, "under a second a call")
    if n <= 1:
        return 1, Reason("steps.not_worth", **figures)
    return n, Reason("steps.measured", n=n, limit=bound, **figures)


def _in_run(
    decided: Decided, limit: steps_rules.StepsLimit, epoch: int | None
) -> Found:
    """One step a call to begin with, and the bounds within which the run
    itself moves it (`apply.steps_in_run`): nothing is timed before it."""
    n, why = _capped(epoch, limit, decided.plan)
    bounds = steps_in_run.Bounds(n, why, limit, decided.plan.accumulation_steps)
    found = _decided(decided, 1, Reason("steps.in_run", cap=n, why=why))
    return dataclasses.replace(found, settled={**found.settled, "steps_in_run": bounds})


def _yours(
    decided: Decided, limit: steps_rules.StepsLimit | None, steps_per_epoch: Any
) -> Found:
    """A value of yours (fit's or compile's), as Keras trains it; one a call
    where it would leave a backup unable to count an epoch's steps
    (`_uncounted`), and said where it does not divide `steps_per_epoch`."""
    known = _keras_knows_epoch(decided, steps_per_epoch)
    several = decided.plan.steps_per_execution > 1
    if several and not known and limit is not None and limit.counts_steps:
        return _uncounted(decided, limit.counts_steps)
    return _overrun_said(decided, steps_per_epoch)


def _keras_knows_epoch(decided: Decided, steps_per_epoch: Any) -> bool:
    """Whether Keras's fit knows the epoch's steps (its callbacks'
    `params["steps"]`): `steps_per_epoch`, arrays, a `PyDataset`, a
    `tf.data` pipeline of known length; not a generator or a grain loader."""
    if isinstance(steps_per_epoch, int) and steps_per_epoch > 0:
        return True
    data = decided.data
    return data.kind in ("arrays", "pydataset") or (
        data.kind == "dataset" and bool(data.num_samples)
    )


def _uncounted(decided: Decided, who: str) -> Found:
    """One step a call, with a warning, where a value of yours would leave
    `who` unable to count an epoch's steps: its length is unknown, and Keras
    gives a short last call the end a whole call would have."""
    n = decided.plan.steps_per_execution
    words = (
        f"steps_per_execution={n} was not applied: in an epoch of unknown "
        f"length, Keras reports its short last call as {n} steps, and "
        f"{who} would count them wrong and resume elsewhere. Trained at 1 "
        "a call; pass steps_per_epoch= to train at yours."
    )
    why = Reason("steps.default", why=f"{who} in an epoch of unknown length")
    options = dataclasses.replace(decided.options, steps_per_execution=1)
    found = Measured().decided(steps_per_execution=why).warned(words)
    return Found(found, {"options": options})


def _overrun_said(decided: Decided, steps_per_epoch: Any) -> Found:
    """`decided`, with a warning where the steps per call you set do not
    divide `steps_per_epoch`: Keras then runs each epoch's last call whole,
    past the epoch's end, on the iterator that runs on across epochs (as
    `model.fit` does with that `compile(steps_per_execution=...)`)."""
    plan = decided.plan
    n = plan.steps_per_execution
    if not (isinstance(steps_per_epoch, int) and steps_per_epoch > 0) or n <= 1:
        return Found()
    epoch = steps_per_epoch * plan.accumulation_steps
    if epoch % n == 0:
        return Found()
    ran = -(-epoch // n) * n
    return Found(
        Measured().warned(
            f"steps_per_execution={n} does not divide the {epoch} steps of an "
            f"epoch (steps_per_epoch={steps_per_epoch}): Keras runs each call "
            f"whole, so an epoch trains {ran} steps, as model.fit does with "
            "this value. Pass a divisor of it for epochs of exactly that many."
        )
    )


def _why_not(
    decided: Decided,
    limit: steps_rules.StepsLimit,
    epoch: int | None,
    on_cluster: bool,
) -> str | Reason | None:
    """Why the run keeps one step a call without a measurement, or None."""
    if limit.held is not None:
        return limit.held
    if on_cluster:
        return "not measured on a cluster, where each worker would time its own"
    if decided.data.kind not in ("arrays", "dataset") or not decided.data.measurable:
        what = decided.data.why_not_measurable or "input that is read only once"
        return f"not measured: {what}"
    if not decided.model.measurable:
        return f"not measured: {decided.model.why_not_measurable}"
    if epoch is None:
        # Keras counts the last call of an epoch of unknown length as a
        # whole call: the steps the callbacks see would be off.
        return "not measured: the epoch's length is unknown"
    if epoch // steps_rules.EPOCH_SHARE < 2:
        return f"an epoch of {epoch} steps is too short to share out"
    if _cap(epoch, limit, decided.plan) < 2:
        return "the run's callbacks allow no other value"
    return None


def _cap(epoch: int | None, limit: steps_rules.StepsLimit, plan: Any) -> int:
    """The largest value the epoch and the bounds allow, before timing."""
    return _capped(epoch, limit, plan)[0]


def _capped(
    epoch: int | None, limit: steps_rules.StepsLimit, plan: Any
) -> tuple[int, str]:
    """`_cap`, and the bound that set it, in words."""
    n, why = steps_rules.MAX_STEPS, f"at most {steps_rules.MAX_STEPS}"
    if epoch is not None and epoch // steps_rules.EPOCH_SHARE < n:
        n, why = epoch // steps_rules.EPOCH_SHARE, "a quarter of an epoch"
    n, lowered = limit.largest(n, plan.accumulation_steps)
    return n, lowered or why


def _epoch_steps(decided: Decided, steps_per_epoch: Any) -> int | None:
    """Forward passes an epoch (Keras's steps), where known."""
    plan, data = decided.plan, decided.data
    if isinstance(steps_per_epoch, int) and steps_per_epoch > 0:
        return steps_per_epoch * plan.accumulation_steps
    if data.num_samples:
        return math.ceil(data.num_samples / max(1, plan.step_batch_size))
    return None


def _one(decided: Decided, why: str | Reason) -> Found:
    reason = why if isinstance(why, Reason) else Reason("steps.default", why=why)
    return _decided(decided, 1, reason)


def _decided(decided: Decided, n: int, why: Reason) -> Found:
    options = dataclasses.replace(decided.options, steps_per_execution=n)
    return Found(Measured().decided(steps_per_execution=why), {"options": options})


def _timed(decided: Decided, given: Given, k: int) -> HostPath:
    """Seconds a step at one step a call and at `k`, on a copy of the model
    training the real data under the plan (the faster of `ROUNDS`
    interleaved windows each)."""
    plan = decided.plan
    with Session() as session:
        session.enter(model_lib.preserved_state())
        candidate = trial_bench.Prepared(
            session,
            given,
            decided.data,
            plan,
            batch=plan.micro_batch_size,
            policy=plan.precision,
            optimize=decided.optimize_data,
        )
        at: dict[int, list[float]] = {1: [], k: []}
        for _ in range(ROUNDS):
            for n in (1, k):
                undo = steps_lib.apply(candidate.model, n)
                try:
                    clock = StepClock(WARM_CALLS, 0.0, WINDOW_SECONDS, MIN_CALLS)
                    per_second = candidate.fit_with(clock).speed(1)
                    if not per_second:
                        raise RuntimeError("no step was timed")
                    at[n].append(1 / per_second)
                finally:
                    if undo is not None:
                        undo(True)
    return HostPath(min(at[1]), min(at[k]), k)
