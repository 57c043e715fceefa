"""How one kerascale call reached its decision, recorded (tests/test_ladder.py,
tests_jax/test_jax_ladder.py): each entry of `decide`, the functions it was
entered from, and how many times each measurement stage ran inside it.

The promise (issues 57 and 82): `decide`, the one entrance to a decision
(fit's, plan's, diagnose's and find_batch_size's stage lists), is entered
once per attempt, and only by the door's ladder
(`kerascale.plan.fallback.attempted`). It is never entered from inside itself
or from the apply floor; each stage is entered at most once in an entry, only
by the loop (`kerascale.measure.stages.run`), and never from inside another
stage. A failure that kerascale answers is a rung of that one ladder, not a
retry inside a stage.
"""

from __future__ import annotations

import collections
import dataclasses
import sys

from kerascale.measure import decide as decide_lib
from kerascale.measure import stages as stages_lib

LADDER = "kerascale.plan.fallback.attempted"
LOOP = "kerascale.measure.stages.run"


@dataclasses.dataclass
class Entry:
    """One entry of `decide`: the functions on the stack above it, innermost
    first (as "module.function"), and each stage's count inside it."""

    callers: tuple[str, ...]
    stages: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # Where a stage was entered from other than the loop, or inside another.
    strays: list[str] = dataclasses.field(default_factory=list)


class Attempts:
    """Records every entry of `decide` while installed (`record`)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._open: list[Entry] = []
        self._in_stage: list[str] = []

    def check(self, attempts: int) -> None:
        """Asserts `attempts` entries of `decide`, each from the ladder and
        from nowhere else that decides, with each stage run at most once."""
        assert len(self.entries) == attempts, [e.callers[:4] for e in self.entries]
        for entry in self.entries:
            assert LADDER in entry.callers, entry.callers
            inner = [
                c
                for c in entry.callers
                if c.startswith("kerascale.measure.decide.")
                or c.startswith("kerascale.apply.")
            ]
            assert not inner, f"decide entered from {inner}"
            again = {k: n for k, n in entry.stages.items() if n > 1}
            assert not again, f"stages run more than once in one entry: {again}"
            assert entry.stages, "no stage was entered"
            assert not entry.strays, entry.strays

    def _entered(self, real):
        def entered(stage, at):
            name = type(stage).__name__
            if self._open:
                entry = self._open[-1]
                entry.stages[name] += 1
                caller = sys._getframe(1)
                where = f"{caller.f_globals.get('__name__')}.{caller.f_code.co_name}"
                if where != LOOP:
                    entry.strays.append(f"{name} entered from {where}")
                if self._in_stage:
                    entry.strays.append(f"{name} entered inside {self._in_stage[-1]}")
            self._in_stage.append(name)
            try:
                return real(stage, at)
            finally:
                self._in_stage.pop()

        return entered

    def _decide(self, real):
        def entered(*args, **kwargs):
            frame, callers = sys._getframe(1), []
            while frame is not None:
                callers.append(
                    f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}"
                )
                frame = frame.f_back
            entry = Entry(tuple(callers))
            self.entries.append(entry)
            self._open.append(entry)
            try:
                return real(*args, **kwargs)
            finally:
                self._open.pop()

        return entered


def record(monkeypatch) -> Attempts:
    """Installs the recording for the rest of the test (`monkeypatch` undoes
    it): every kerascale module's name for `decide`, and the loop's seam
    through which each stage is entered (`stages.entered`)."""
    attempts = Attempts()
    real = decide_lib.decide
    entered = attempts._decide(real)
    for name, module in list(sys.modules.items()):
        if name.startswith("kerascale") and module is not None:
            for attr, value in list(vars(module).items()):
                if value is real:
                    monkeypatch.setattr(module, attr, entered)
    monkeypatch.setattr(stages_lib, "entered", attempts._entered(stages_lib.entered))
    return attempts
