"""The one fallback ladder, and the loop that walks it.

Every failure that kerascale answers, rather than raises, is a
`Recoverable`: raised where it happens, and caught only by the door's loop,
`attempted`. It names its rung; `next_attempt` turns the attempt that failed
and the failure into the next attempt, or None where no rung answers it (the
error is then the model's own, raised as `model.fit` raises it). Each rung is
taken at most once in a call, so the loop ends.

The rungs (`RUNGS`):

- "recreate": re-creating the model failed (`apply.model.CannotRecreate`):
  decide again without re-creating.
- "place": laying the model's variables out over the devices failed
  (`apply.model.CannotPlace`): decide again on one device.
- "probe_precision": a batch-search probe failed, for a reason other than
  memory, under the mixed precision kerascale chose (`FailedInProbe`):
  decide again in the model's own precision.
- "tpu_cores": a TPU's core count is known only once its system starts
  (`LateCoreCount`): decide again over the strategy that started it.
- "first_step": the first training step failed
  (`apply.session.FirstStepFailed`): a searched batch that ran out of memory
  steps down; otherwise the choices kerascale made on its own become plain
  `fit`'s (`after_first_step`).

No stage retries, and the apply floor never calls back up to decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from kerascale.plan.measured import NOTHING, Measured
from kerascale.plan.options import Options
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason
from kerascale.sense.model_facts import gist

T = TypeVar("T")

RUNGS = ("recreate", "place", "probe_precision", "tpu_cores", "first_step")


class Recoverable(Exception):
    """A failure that a rung of the ladder answers (`RUNGS`): raised where it
    happens, caught only by `attempted`."""

    rung: ClassVar[str] = ""

    def unanswered(self) -> BaseException:
        """What the user gets where no rung answers: the failure itself."""
        return self


class FailedInProbe(Recoverable):
    """A batch-search probe failed, for a reason other than memory, under
    the mixed precision `tried` that kerascale chose in place of the model's
    own `policy`."""

    rung = "probe_precision"

    def __init__(self, error: str, *, tried: str, policy: str):
        super().__init__(error)
        self.error, self.tried, self.policy = error, tried, policy


class LateCoreCount(Recoverable):
    """A TPU system started with a core count other than the plan's: the
    decision is made again over `strategy`, the strategy that started it."""

    rung = "tpu_cores"

    def __init__(self, strategy: Any, cores: int, planned: int):
        super().__init__(f"the TPU has {cores} cores, the plan assumed {planned}")
        self.strategy = strategy


class FirstStepFailed(Recoverable):
    """Training raised `error` inside a training step before any step
    completed: nothing was trained under `plan`.

    Attributes:
        error: What the step raised (the user's error where no rung answers).
        plan: The plan that trained.
        policy: The model's own precision.
        searched: Whether kerascale searched the plan's batch.
        out_of_memory: Whether `error` means memory ran out.
        model_steps: The steps per call the model was compiled with.
    """

    rung = "first_step"

    def __init__(
        self,
        error: BaseException,
        *,
        plan: Plan,
        policy: str,
        searched: bool,
        out_of_memory: bool,
        model_steps: int = 1,
    ):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error, self.plan, self.policy = error, plan, policy
        self.searched, self.out_of_memory = searched, out_of_memory
        self.model_steps = model_steps

    def unanswered(self) -> BaseException:
        return self.error


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one attempt decides with.

    Attributes:
        options: Its options.
        not_rebuildable: Why the model cannot be re-created, once an attempt
            found out ("" before).
        unplaceable: Why its variables cannot be laid out over the devices,
            once an attempt found out ("" before).
        measured: What the rungs taken found, for the plan's reasons and
            warnings (added after every stage).
        taken: The rungs taken to reach it, in order.
        said: The warnings an earlier attempt gave before its first step
            failed, not given again; None where no attempt has trained.
    """

    options: Options
    not_rebuildable: str = ""
    unplaceable: str = ""
    measured: Measured = NOTHING
    taken: tuple[str, ...] = ()
    said: tuple[str, ...] | None = None

    def held(self, warnings: tuple[str, ...]) -> tuple[str, ...]:
        """The plan's `warnings` to give only once a first step has run: after
        a failed first step, what this attempt adds (failing the same way,
        the error is the model's own, and the fallback's words would mislead)."""
        if self.said is None:
            return ()
        return tuple(w for w in warnings if w not in self.said)


def attempted(run: Callable[[Attempt], T], options: Options) -> T:
    """`run(attempt)` from the first attempt (`options`), then from each
    rung's next attempt, until one returns; where no rung answers a failure,
    its error is raised."""
    attempt = Attempt(options)
    while True:
        try:
            return run(attempt)
        except Recoverable as failure:
            following = next_attempt(attempt, failure)
            if following is None:
                error = failure.unanswered()
                if error is failure:
                    raise
                raise error from None
            attempt = following


def next_attempt(attempt: Attempt, failure: Recoverable) -> Attempt | None:
    """The attempt after `attempt` failed with `failure`, or None where no
    rung answers it (or its rung was taken already)."""
    if failure.rung not in RUNGS or failure.rung in attempt.taken:
        return None
    following = _answer(attempt, failure)
    if following is None:
        return None
    return dataclasses.replace(following, taken=(*attempt.taken, failure.rung))


def _answer(attempt: Attempt, failure: Recoverable) -> Attempt | None:
    """`attempt` changed as `failure`'s rung says."""
    options = attempt.options
    if failure.rung == "recreate":
        return dataclasses.replace(attempt, not_rebuildable=str(failure))
    if failure.rung == "place":
        return dataclasses.replace(attempt, unplaceable=str(failure))
    if isinstance(failure, FailedInProbe):
        why = Reason(
            "precision.failed_in_probe",
            policy=failure.policy,
            tried=failure.tried,
            error=failure.error,
        )
        return dataclasses.replace(
            attempt,
            options=dataclasses.replace(options, precision=failure.policy),
            measured=attempt.measured | Measured().decided(precision=why).warned(why),
        )
    if isinstance(failure, LateCoreCount):
        strategy = failure.strategy
        return dataclasses.replace(
            attempt, options=dataclasses.replace(options, strategy=strategy)
        )
    if not isinstance(failure, FirstStepFailed):
        return None
    step = after_first_step(
        options,
        failure.plan,
        failure.policy,
        searched=failure.searched,
        out_of_memory=failure.out_of_memory,
        error=failure.error,
        model_steps=failure.model_steps,
    )
    if step is None:
        return None
    return dataclasses.replace(
        attempt,
        options=step.options,
        measured=attempt.measured | step.measured,
        said=failure.plan.warnings,
    )


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
    "steps_per_execution": "steps_per_execution",
}


def after_first_step(
    options: Options,
    plan: Plan,
    model_policy: str,
    *,
    searched: bool,
    out_of_memory: bool,
    error: BaseException,
    model_steps: int = 1,
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
    plainer, what = plain(options, plan, model_policy, model_steps)
    if not what:
        return None
    # The arguments that skip each attempt, as the user writes them.
    skip: dict[str, Any] = {
        "strategy": plainer.strategy,
        "precision": plainer.precision,
        "optimize_data": plainer.optimize_data,
        "recompute": False,
        "steps_per_execution": plainer.steps_per_execution,
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


def plain(
    options: Options, plan: Plan, model_policy: str, model_steps: int = 1
) -> tuple[Options, str]:
    """`options` with the choices kerascale made on its own, in `plan`, set
    to what plain `model.fit` does (the model's own precision and steps per
    call, the data as given); and those choices, in words ("" when there are
    none)."""
    changes: dict[str, Any] = {}
    said = []
    # kerascale raises an "auto" value only above a compiled 1 (it keeps
    # yours, or lowers it where Keras fails at it).
    if options.steps_per_execution == "auto" and plan.steps_per_execution > max(
        1, model_steps
    ):
        changes["steps_per_execution"] = model_steps
        said.append(f"{plan.steps_per_execution} steps a call")
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
