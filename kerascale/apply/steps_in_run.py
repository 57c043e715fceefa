"""The steps per call (Keras's `steps_per_execution`) chosen inside the run:
a `Lever` of the run's controller (issue 79).

The run starts at one step a call, as `model.fit` does, and its first epoch
is the measurement: seconds a step, the first call (which traces) apart.
At that epoch's end the lever moves to `k` a call, the largest value the
run's bounds allow (`plan.steps`: its callbacks' save points, a quarter of an
epoch, a call under a second at the step time just measured), where the
rest of the run can repay the move: the host's usual path per call
(`HOST_PRIOR`) saved on every step left, against a new trace (what the
first call took beyond a step) and a new `fit`'s start. The next epoch at
`k` is timed the same way; where a step there is not faster, the run goes
back to one a call (the functions traced at one are kept: nothing traces
again), else it keeps `k`. Nothing is copied and nothing traces before the
run; the updates are the same, in the same order, at any value.

Its design: docs/design/modules.md, `kerascale.apply.steps_in_run`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kerascale.apply import steps as steps_lib
from kerascale.apply.controller import Lever
from kerascale.errors import warn
from kerascale.plan import steps as steps_rules
from kerascale.plan.reasons import Reason

# The host's path per call that moving is weighed with, before it is
# measured (2 cores, the issue 59 MLP, plain fit: TensorFlow 0.5 ms, JAX
# 0.15 ms), at most this share of the step measured at one a call.
HOST_PRIOR = {"tensorflow": 5e-4, "jax": 2e-4}
PRIOR_SHARE = 0.9
# Below this share of a step the host's path is left as Keras has it: the
# gain would be within an epoch's noise (2-5% on 2 cores).
MIN_SHARE = 0.05
# A move must save this many times what it costs (a trace, a new fit's
# start) over the rest of the run, counted with the prior.
REPAY = 2.0
# What starting a new `fit` costs beyond the trace (its data adapter and
# iterator, the callbacks' set-up; TensorFlow, 2 cores: about 0.1 s).
RESTART_SECONDS = 0.1
# `k` is kept where a step there is at most this much slower than at one (a
# busy machine slows one epoch); beyond it the run goes back to one.
TOLERANCE = 0.03
# Steps an epoch needs, beyond its first call, for its time to count.
TIMED_STEPS = 4


def expected_step(t1: float, backend: str, k: int) -> float:
    """A step's expected seconds where the run may move to up to `k` steps a
    call, from its seconds at one (`t1`): less the host's path per call that
    a move is weighed with (`HOST_PRIOR`, at most `PRIOR_SHARE` of `t1`),
    saved on all but one step in `k`; `t1` where no move would be made (the
    path under `MIN_SHARE` of a step, or `k` under 2). What an estimate of
    a run says before the run has timed anything."""
    host = min(HOST_PRIOR.get(backend, HOST_PRIOR["tensorflow"]), PRIOR_SHARE * t1)
    if k < 2 or t1 <= 0 or host / t1 < MIN_SHARE:
        return t1
    return t1 - host * (1 - 1 / k)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What bounds `k` before the run: the largest value the plan's rules
    allow (`cap`, and the rule that set it), and the bounds that land it on
    the steps the run's callbacks name (`limit`, with the accumulation's
    micro-batches)."""

    cap: int
    why: str
    limit: steps_rules.StepsLimit
    accumulation: int = 1

    def largest(self, n: int, because: str) -> tuple[int, str]:
        """The largest allowed value up to `n` (which `because` set), and
        what set it."""
        if n >= self.cap:
            n, because = self.cap, self.why
        m, lowered = self.limit.largest(n, self.accumulation)
        return m, lowered or because


@dataclasses.dataclass
class _Epoch:
    """One epoch's timing: its seconds after its first call (and its
    validation's first call), over its steps after the first call."""

    n: int
    seconds: float
    steps: int
    train_excess: float  # the training's first call's seconds beyond its steps
    test_excess: float = 0.0  # the validation's first call's, beyond a step
    validation: float = 0.0  # the validation's seconds after its first call

    @property
    def first_excess(self) -> float:
        """The first calls' seconds beyond their steps (their traces)."""
        return self.train_excess + self.test_excess

    @property
    def per_step(self) -> float:
        return self.seconds / self.steps

    @property
    def training_step(self) -> float:
        """Seconds a training step, the validation left out."""
        return (self.seconds - self.validation) / self.steps


class StepsInRun(Lever):
    """Chooses the steps per call from the run's own first epochs.

    Args:
        bounds: What bounds the value (`Bounds`).
        backend: The Keras backend (the prior's host path).
        say: Where a change is told (`print`, or nothing).
        clock: The seconds clock (a seam for tests).
    """

    own = ("steps_per_execution",)

    def __init__(
        self,
        bounds: Bounds,
        backend: str,
        *,
        say: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self.bounds, self.say, self.clock = bounds, say, clock
        self.prior = HOST_PRIOR.get(backend, HOST_PRIOR["tensorflow"])
        self.n = 1
        self.epochs: list[_Epoch] = []
        self.undo: Callable[[bool], None] | None = None
        self.done = False
        self.reason: Reason | None = None  # how the value was chosen
        self.proposed: int | None = None  # the move asked at this epoch's end
        # A step's time at one a call, at the batch another lever moved to
        # with this lever's move, over the one timed (`rebased`).
        self.extra = 0.0
        self._why = ""  # what set `k`'s bound
        self._reset()

    def _reset(self) -> None:
        self._start = self._first_end = self._test_begin = 0.0
        self._test_first = self._test_end = 0.0
        self._first_steps = 0

    # Timing: an epoch's first call traces (at a new value, or the first
    # ever), and so may its validation's first call: both are left out.

    def on_epoch_begin(self, epoch, logs=None):
        self._reset()
        self._start = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        if not self._first_end:
            self._first_end = self.clock()
            self._first_steps = batch + 1

    def on_test_begin(self, logs=None):
        self._test_begin = self.clock()

    def on_test_batch_end(self, batch, logs=None):
        if self._test_begin and not self._test_first:
            self._test_first = self.clock() - self._test_begin

    def on_test_end(self, logs=None):
        if self._test_begin:
            self._test_end = self.clock()

    def on_epoch_end(self, epoch, logs=None):
        end = self.clock()
        steps = (self.params or {}).get("steps") or 0
        timed = steps - self._first_steps
        if not self._first_end or timed < TIMED_STEPS:
            return
        first = self._first_end - self._start
        seconds = end - self._first_end - self._test_first
        validation = max(0.0, self._test_end - self._test_begin - self._test_first)
        per_step = (seconds - validation) / timed  # a training step's
        train_excess = max(0.0, first - per_step * self._first_steps)
        test_excess = max(0.0, self._test_first - per_step * self.n)
        self.epochs.append(
            _Epoch(self.n, seconds, timed, train_excess, test_excess, validation)
        )

    # Deciding, at an epoch's end.

    def timed_at_one(self) -> _Epoch | None:
        """The run's first epoch timed at one step a call, or None."""
        return next((e for e in self.epochs if e.n == 1), None)

    def saved_per_step(self, k: int) -> float:
        """The seconds a step saves at `k` a call over one, by the host's
        path per call (the prior, at most `PRIOR_SHARE` of the step timed
        at one)."""
        at_one = self.timed_at_one()
        if at_one is None or k < 2:
            return 0.0
        return min(self.prior, PRIOR_SHARE * at_one.per_step) * (1 - 1 / k)

    def rebased(self, extra: float) -> None:
        """Another lever moves the batch with this lever's move: a step at
        one a call would take `extra` seconds more at the new batch, and
        the check of `k` compares with that."""
        self.extra = max(0.0, extra)

    def propose(self, epoch, logs):
        self.proposed = None
        if self.done or not self.epochs or self.epochs[-1].n != self.n:
            return None
        last = self.epochs[-1]
        if self.n == 1:
            return self._first_move(epoch, last)
        return self._checked(last)

    def would_move(self, epoch: int) -> int | None:
        """The value this epoch's end will move to from one a call, where it
        is the run's first timed epoch and the move repays itself, else
        None. Asked before `propose` (by the batch lever, to join it)."""
        if self.done or self.n != 1 or not self.epochs or self.epochs[-1].n != 1:
            return None
        return self._first_choice(epoch, self.epochs[-1])[0]

    def _first_move(self, epoch: int, at_one: _Epoch) -> dict[str, int] | None:
        """`k` where the rest of the run repays the move, else None (and
        the run keeps one a call)."""
        self.done = True
        k, self.reason = self._first_choice(epoch, at_one)
        if k is None:
            return None
        self.done = False
        self.proposed = k
        return {"steps_per_execution": k}

    def _first_choice(
        self, epoch: int, at_one: _Epoch
    ) -> tuple[int | None, Reason | None]:
        """`k`, or None and why the run stays at one a call."""
        step = at_one.per_step
        by_time = max(1, int(steps_rules.MAX_CALL_SECONDS / max(step, 1e-9)))
        k, self._why = self.bounds.largest(by_time, "under a second a call")
        host = min(self.prior, PRIOR_SHARE * step)
        figures = dict(t1=step * 1e3, host=host * 1e3)
        if host / step < MIN_SHARE or k < 2:
            return None, Reason("steps.run_not_worth", **figures)
        steps_left = (self.params["epochs"] - epoch - 1) * (self.params["steps"] or 0)
        saved = steps_left * host * (1 - 1 / k)
        cost = at_one.first_excess + RESTART_SECONDS
        if saved < REPAY * cost:
            return None, Reason(
                "steps.run_unpaid", saved=saved, cost=cost, k=k, **figures
            )
        return k, None

    def _checked(self, at_k: _Epoch) -> dict[str, int] | None:
        """Keeps `k` where a step there is faster than at one (within
        `TOLERANCE`), else goes back to one."""
        self.done = True
        at_one = next(e for e in self.epochs if e.n == 1)
        t1, tk, k = at_one.per_step + self.extra, at_k.per_step, self.n
        share = max(0.0, (t1 - tk) * k / (k - 1)) / t1
        figures = dict(share=min(share, 1.0), t1=t1 * 1e3, tk=tk * 1e3, k=k)
        if tk > t1 * (1 + TOLERANCE):
            self.reason = Reason("steps.run_back", **figures)
            return {"steps_per_execution": 1}
        self.reason = Reason("steps.run_measured", n=k, limit=self._why, **figures)
        return None

    def outcome(self) -> tuple[int, Reason]:
        """The steps per call the run ended at, and how they were chosen."""
        if self.reason is not None:
            return self.n, self.reason
        if self.n > 1:
            t1 = self.epochs[0].per_step * 1e3
            return self.n, Reason("steps.run_moved", n=self.n, t1=t1, limit=self._why)
        return 1, Reason("steps.run_short")

    def changed(self, arguments):
        n = arguments["steps_per_execution"]
        if n == 1:
            self._put_back()
        else:
            self.undo = steps_lib.apply(self.model, n)
        if self.say is not None:
            said = self._said()
            self.say(f"kerascale: {n} steps a call from the next epoch ({said})")
        self.n = n

    def _said(self) -> str:
        if self.reason is not None:
            return str(self.reason)
        return f"{self.epochs[-1].per_step * 1e3:.2f} ms a step at 1; {self._why}"

    def undone(self, arguments, error):
        n = arguments["steps_per_execution"]
        self._put_back()
        self.done, self.n = True, 1
        self.reason = Reason(
            "steps.default",
            why=f"{n} a call failed in the run ({type(error).__name__})",
        )
        return (
            f"Not applied: steps_per_execution={n}, because its first call failed "
            f"({type(error).__name__}: {str(error)[:200]}): the run goes on at one "
            "step a call. To set it yourself, pass steps_per_execution=."
        )

    def _put_back(self) -> None:
        if self.undo is not None:
            undo, self.undo = self.undo, None
            undo(True)

    def finish(self):
        try:
            self._put_back()
        except Exception as e:  # the trained weights stand; only the value
            warn(
                "kerascale could not put back your model's steps_per_execution "
                f"after the run ({type(e).__name__}: {e}); compile it again to "
                "set it."
            )
