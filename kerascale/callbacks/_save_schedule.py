"""When a `FaultTolerantBackup` saves: at epoch ends, every N optimizer
updates, or at the first update after a duration. A save never splits an
accumulation window, and one due at an epoch's last batch waits for its end."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kerascale import _validation as v

_ACCEPTED = (
    '"epoch", a positive int (every N batches) or a duration like "10min", '
    '"30s" or "1h"'
)


def parse_save_freq(
    save_freq: Any, *, name: str = "save_freq"
) -> tuple[int | None, float | None]:
    """`save_freq` as (every N batches, every S seconds); (None, None) at
    epoch ends. Raises `ConfigurationError` naming a value it cannot read,
    as the argument `name` (`kerascale.fit`'s is `checkpoint_freq`)."""
    if isinstance(save_freq, str):
        if save_freq == "epoch":
            return None, None
        seconds = v.parse_duration(save_freq)
        if seconds is None or seconds <= 0:
            raise v.fail(name, save_freq, _ACCEPTED)
        return None, seconds
    return v.positive_int(name, save_freq, accepted=_ACCEPTED), None


@dataclasses.dataclass
class SaveSchedule:
    """One run's saves: what is due, and where the last one was.

    Attributes:
        every_steps: Save every this many optimizer updates (None: not by steps).
        every_seconds: Save at the first update this long after the last save.
        clock: Seconds, monotonic (a seam for tests).
        last_step: The run's batch count at the last save (or the resumed one).
        last_time: `clock()` at the last save (or the run's start).
        at_boundary: Whether the newest checkpoint is at an epoch's end.
        at_epoch_end: A save waits for the epoch's end.
        owed: A time-based save all workers agreed on, at the window's end.
    """

    every_steps: int | None
    every_seconds: float | None
    clock: Callable[[], float] = time.monotonic
    last_step: int = 0
    last_time: float = 0.0
    at_boundary: bool = True
    at_epoch_end: bool = False
    owed: bool = False

    @property
    def by_epoch(self) -> bool:
        """Whether every epoch's end saves (`save_freq="epoch"`)."""
        return self.every_steps is None and self.every_seconds is None

    def start_clock(self) -> None:
        self.last_time = self.clock()

    def time_due(self) -> bool:
        """Whether this worker's time-based save is due (workers then agree)."""
        return (
            self.every_seconds is not None
            and self.clock() - self.last_time >= self.every_seconds
        )

    def due(self, global_step: int, k: int) -> bool:
        """Whether a save is due after the run's `global_step`-th batch, with
        `k` batches to an optimizer update: owed, or `every_steps` updates
        since the last save; never inside a window."""
        due = self.owed or (
            self.every_steps is not None
            and global_step - self.last_step >= self.every_steps * k
        )
        return due and global_step % k == 0

    def saved(self, global_step: int, *, at_boundary: bool) -> None:
        self.last_step = global_step
        self.last_time = self.clock()
        self.at_epoch_end = self.owed = False
        self.at_boundary = at_boundary
