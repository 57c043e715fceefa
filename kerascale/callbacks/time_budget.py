"""`TimeBudget`: stop before a deadline, leaving time for the last checkpoint."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kerascale import _keras_compat as keras_compat
from kerascale import _validation as v
from kerascale.apply import step_agreement as agreement_lib
from kerascale.apply.model import accumulation_steps, core_optimizer
from kerascale.callbacks._base import KerascaleCallback
from kerascale.errors import warn
from kerascale.sense.model_facts import steps_per_call

if TYPE_CHECKING:
    from kerascale.callbacks.backup import FaultTolerantBackup

logger = logging.getLogger("kerascale")


class TimeBudget(KerascaleCallback):
    """Stops training before a deadline, leaving time for a final checkpoint.

    It projects the finish time from measured epoch and step times, warns as
    soon as the run is projected to overrun the budget, and sets
    `model.stop_training` at the last optimizer update that leaves `reserve`
    seconds (plus the time an epoch's end took, when the next update ends an
    epoch) before the deadline. Under gradient accumulation it stops only
    where an update ends, so no window's work is dropped. With a
    `FaultTolerantBackup`, the run saves on the way out and a rerun continues
    at that batch.

    Args:
        budget: Seconds, or a string like "18h", "90min", "1h30min".
        reserve: Seconds kept free at the end for saving and exiting.
            Defaults to `None`: 2% of the budget, at least 1 s and at most
            5 minutes, plus twice the slowest checkpoint save seen (when
            `kerascale.fit` pairs it with its backup).
        clock: A seam for tests: a function returning seconds. Defaults to
            `time.monotonic`.

    Example:

    >>> model.fit(ds, epochs=1000, callbacks=[backup, TimeBudget("18h")])
    """

    def __init__(
        self,
        budget: float | str,
        *,
        reserve: float | None = None,
        clock: Callable[[], float] | None = None,
    ):
        super().__init__()
        self.budget = v.duration("budget", budget)
        if reserve is not None:
            if isinstance(reserve, bool) or not isinstance(reserve, (int, float)):
                raise v.fail("reserve", reserve, "seconds >= 0 (a number) or None")
            if not 0 <= reserve < self.budget:
                raise v.fail(
                    "reserve", reserve, f"seconds in [0, budget={self.budget:g})"
                )
        self.reserve = reserve
        if clock is not None and not callable(clock):
            raise v.fail("clock", clock, "a function returning seconds, or None")
        self._clock = clock or time.monotonic
        self.backup: FaultTolerantBackup | None = None  # to reserve its save time
        self.stopped_early = False
        self.projected_seconds: float | None = None

    def on_train_begin(self, logs=None):
        self.start_run()
        # Across workers, the stop is agreed on: every worker stops at the
        # same step, one step after the one that asked for it.
        self._agreement = agreement_lib.for_run(self.model, self.run)
        if self._agreement is not None:  # a fit that raises skips on_train_end
            self.run.watch(self.release)
        self._stop_owed = False
        self._start = self._clock()
        self._epoch_seconds: list[float] = []
        self._step_seconds: float | None = None
        self._end_overhead = 0.0
        self._warned = False
        self.stopped_early = False
        self._last_batch_end: float | None = None
        self._epoch_steps = self.params.get("steps")
        # Under gradient accumulation, stops fall on the ends of windows of
        # k batches (what a stop mid-window trained would be dropped).
        self._k = accumulation_steps(self.model)
        optimizer = core_optimizer(getattr(self.model, "optimizer", None))
        self._micro = (
            int(getattr(optimizer, "iterations", 0) or 0) if self._k > 1 else 0
        )
        self._spe = steps_per_call(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_start = self._clock()
        self._steps = 0
        if self._last_batch_end is not None:  # validation + epoch-end callbacks
            self._end_overhead = max(
                self._end_overhead, self._epoch_start - self._last_batch_end
            )

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = self._clock()

    def on_train_batch_end(self, batch, logs=None):
        now = self._clock()
        took = now - self._batch_start
        # A moving average: quick to follow a change, not fooled by one step.
        self._step_seconds = (
            took
            if self._step_seconds is None
            else 0.8 * self._step_seconds + 0.2 * took
        )
        self._last_batch_end = now
        # The steps this call ran: steps_per_execution, or fewer at an
        # epoch's end.
        batch = keras_compat.last_step_of_call(self.params, batch)
        self._micro += max(1, batch + 1 - self._steps)
        self._steps = batch + 1
        agreed = self._agreement is not None
        if agreed and "stop" in self._agreement.at_step(self._epoch, batch):
            self._stop_owed = True
        if self._micro % self._k:
            return  # mid-window: the decision waits for the window's end
        what = "step" if self._k == 1 else f"optimizer update ({self._k} batches)"
        if self._stop_owed:
            self._stop(now, f"the next {what} would not finish in time (agreed)")
            return
        # Across workers a stop comes one step after the wish: look one further.
        ahead = self._k * (2 if agreed else 1)
        next_ends_epoch = (
            self._epoch_steps is not None and batch + 1 + ahead >= self._epoch_steps
        )
        needed = ahead * self._step_seconds + (
            self._end_overhead if next_ends_epoch else 0.0
        )
        if now - self._start + needed + self._reserve() >= self.budget:
            if agreed:  # proposed now, for the next step
                self._agreement.want("stop")
                self._agreement.at_step(self._epoch, batch)
            else:
                self._stop(now, f"the next {what} would not finish in time")

    def on_train_end(self, logs=None):
        self.release()

    def release(self) -> None:
        agreement, self._agreement = getattr(self, "_agreement", None), None
        if agreement is not None:
            agreement.close()
        super().release()

    def on_epoch_end(self, epoch, logs=None):
        now = self._clock()
        self._epoch_seconds.append(now - self._epoch_start)
        if self._epoch_steps is None:
            self._epoch_steps = self._steps
        epochs = int(self.params.get("epochs") or 0)
        left = max(0, epochs - epoch - 1)
        self.projected_seconds = (
            now
            - self._start
            + left * statistics.mean(self._epoch_seconds[1:] or self._epoch_seconds)
        )
        if self.projected_seconds > self.budget and not self._warned and left:
            self._warned = True
            per_epoch = _clock_text(statistics.mean(self._epoch_seconds))
            warn(
                f"TimeBudget: at {per_epoch} per epoch, {epochs} epochs would end "
                f"{_clock_text(self.projected_seconds)} after the start, over the "
                f"budget of {_clock_text(self.budget)}; training will stop at about "
                f"{_clock_text(self.budget - self._reserve())} and can be resumed "
                "from its checkpoint."
            )

    def _reserve(self) -> float:
        if self.reserve is not None:
            return self.reserve
        base = min(max(0.02 * self.budget, 1.0), 300.0)
        # The final save: the one still being written behind training, then
        # its own copy and write.
        held = getattr(self.backup, "save_seconds", None) or [0.0]
        written = getattr(self.backup, "write_seconds", None) or [0.0]
        return base + 2 * (max(held) + max(written))

    def _stop(self, now: float, why: str) -> None:
        if self.model.stop_training:
            return
        self.model.stop_training = True
        self.stopped_early = True
        warn(
            f"TimeBudget: stopping after {_clock_text(now - self._start)} of the "
            f"{_clock_text(self.budget)} budget ({why}); "
            f"{_clock_text(self.budget - (now - self._start))} left for the final "
            "checkpoint."
        )


def _clock_text(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"
