"""What the trials found: each candidate's measurement (`Trial`) and the
choices with every trial behind them (`TrialResult`), values that the
decision (`decided.Decided`), the cache and the advice read without the
trials that made them.

Its design: docs/design/modules.md, `kerascale.measure.trials`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kerascale.plan.reasons import Reason

ROUNDS = 3  # repeats per candidate: two give one difference, three a range
MIN_GAIN = 0.03  # below this a difference is a tie, however quiet the machine
MAX_ATTEMPTS = 3  # runs that re-measure a decision taken within noise


@dataclasses.dataclass(frozen=True)
class Trial:
    """One candidate's measurement.

    Attributes:
        samples_per_s: The mean over its repeats.
        spread: (max - min) / mean of the repeats; 0 with one repeat.
        repeats: Each timed window's samples/s.
        failed: Why the candidate could not train, if it could not.
    """

    batch: int  # per replica
    precision: str
    optimize_data: bool
    samples_per_s: float
    spread: float = 0.0
    repeats: tuple[float, ...] = ()
    failed: str = ""
    stage: str = ""  # "batch", "data_changes" or "precision"

    @property
    def key(self) -> tuple[int, str, bool]:
        return (self.batch, self.precision, self.optimize_data)

    def figure(self) -> str:
        if self.failed:
            return f"failed ({self.failed})"
        return f"{self.samples_per_s:.0f} ± {self.spread / 2:.0%}"

    def describe(self) -> str:
        pipe = "optimised pipeline" if self.optimize_data else "pipeline as given"
        unit = "" if self.failed else " samples/s"
        return f"{self.batch}, {self.precision}, {pipe}: {self.figure()}{unit}"


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """The choices, every trial behind them, and how far to trust them.

    Attributes:
        uncertain: The fields decided within noise (measured again later).
        attempts: The runs that measured this decision.
        seconds: What the trials took.
        run_seconds: The expected run they were weighed against, if known.
        skipped: The stages not measured, each with why.
    """

    batch: int
    precision: str
    optimize_data: bool
    trials: tuple[Trial, ...]
    cached: bool = False
    uncertain: tuple[str, ...] = ()
    attempts: int = 1
    seconds: float = 0.0
    run_seconds: float | None = None
    skipped: tuple[tuple[str, str], ...] = ()
    speed: float | None = None  # the first samples/s estimate, kept for later runs

    def measured(self, field: str) -> bool:
        """Whether trials decided `field` (else its rule stands)."""
        return any(t.stage == field for t in self.trials)

    def skip_reason(self, field: str) -> str:
        return dict(self.skipped).get(field, "")

    def why(self, field: str) -> Reason:
        """The reason for `field` of the plan, with every figure behind it."""
        return Reason(
            "trials.measured",
            field=field,
            cached=self.cached,
            rounds=ROUNDS,
            figures="; ".join(t.describe() for t in self.trials if t.stage == field),
            gain=MIN_GAIN,
            attempts=self.attempts,
            max_attempts=MAX_ATTEMPTS,
            uncertain=field in self.uncertain,
            optimized=bool(self.optimize_data),
        )

    def cost(self) -> str:
        """What the trials took, beside the run they were weighed against:
        its length at the speed they timed (steps per call, chosen later in
        the run, can make it much shorter: issue 81 saw 310s said of a run
        of 32s)."""
        if self.run_seconds:
            share = self.seconds / (self.seconds + self.run_seconds)
            return (
                f"trials took {self.seconds:.0f}s, {share:.0%} of a run of about "
                f"{self.run_seconds + self.seconds:.0f}s at the speed they timed"
            )
        return f"trials took {self.seconds:.0f}s"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("cached")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        d = dict(d)
        d["trials"] = tuple(
            Trial(**{**t, "repeats": tuple(t["repeats"])}) for t in d["trials"]
        )
        d["uncertain"] = tuple(d["uncertain"])
        d["skipped"] = tuple(tuple(s) for s in d["skipped"])
        return cls(**d, cached=True)
