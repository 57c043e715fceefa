"""How one kerascale call reached its decision, recorded (tests/test_ladder.py,
tests_jax/test_jax_ladder.py): each entry of `decide`, the functions it was
entered from, and how many times each measurement stage ran inside it.

The promise (issue 57): `decide` (or `find_batch_size`'s `decide_search`)
is entered once per attempt, and only by the
door's ladder (`kerascale.plan.fallback.attempted`). It is never entered from
inside itself or from the apply floor, and each stage runs at most once in an
entry. A failure that kerascale answers is a rung of that one ladder, not a
retry inside a stage.
"""

from __future__ import annotations

import collections
import dataclasses
import sys

from kerascale.measure import decide as decide_lib
from kerascale.measure import engines

# The measurement stages, by the names `decide` calls them through. The
# sharding stage is `engines.sharding`'s answer; the others are globals of
# `kerascale.measure.decide`.
STAGES = ("batch_for_plan", "_tried", "_recomputed", "_recompute_bound", "agree")
LADDER = "kerascale.plan.fallback.attempted"


@dataclasses.dataclass
class Entry:
    """One entry of `decide`: the functions on the stack above it, innermost
    first (as "module.function"), and each stage's count inside it."""

    callers: tuple[str, ...]
    stages: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class Attempts:
    """Records every entry of `decide` while installed (`record`)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._open: list[Entry] = []

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

    def _counted(self, name: str, function):
        def counted(*args, **kwargs):
            if self._open:
                self._open[-1].stages[name] += 1
            return function(*args, **kwargs)

        return counted

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
    it): every kerascale module's name for `decide`, and its stages."""
    attempts = Attempts()
    # fit's, plan's and diagnose's decision, and find_batch_size's.
    for real in (decide_lib.decide, decide_lib.decide_search):
        entered = attempts._decide(real)
        for name, module in list(sys.modules.items()):
            if name.startswith("kerascale") and module is not None:
                for attr, value in list(vars(module).items()):
                    if value is real:
                        monkeypatch.setattr(module, attr, entered)
    for stage in STAGES:
        monkeypatch.setattr(
            decide_lib, stage, attempts._counted(stage, getattr(decide_lib, stage))
        )
    sharding = engines.sharding

    def counted_sharding(backend):
        return attempts._counted("sharding", sharding(backend))

    monkeypatch.setattr(engines, "sharding", counted_sharding)
    return attempts
