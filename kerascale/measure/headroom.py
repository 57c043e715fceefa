"""A CPU search's batches probed in this process while their steps are far
below the memory limit, and in child processes beyond.

A child process costs a TensorFlow import (3 s on 2 cores), which a short
run's search pays in full (issue 39). Where no `memory_limit` was given, the
search works against 80% of the memory available, and a small model's rungs
take a few hundred MB of it: running them here risks nothing and costs no
import. A batch runs here only if twice its predicted growth is under a
quarter of that limit; the prediction is the larger of a prior from the
model's shapes and each batch probed so far, scaled linearly (through zero,
so that the fixed part scales too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kerascale.measure.placement import SAFETY, SHARE
from kerascale.measure.result import OK, ProbeResult
from kerascale.plan.reasons import Reason
from kerascale.sense import memory

if TYPE_CHECKING:
    from kerascale.measure.probe import InProcessProber


class IsolatedProber(Protocol):
    """What this venue asks of the children's (`child.IsolatedProber`),
    named here rather than imported: the venues stand side by side."""

    def __enter__(self) -> IsolatedProber: ...

    def __exit__(self, *exc: Any) -> None: ...

    def sweep(self, batches: list[int]) -> list[ProbeResult]: ...

    def baseline_bytes(self) -> int | None: ...


class HeadroomProber:
    """`sweep` as the probers' protocol: batches in `here` (an
    `InProcessProber`) while `admits` them, the rest in a child prober, made
    by `isolated()` at the first batch that is not admitted."""

    def __init__(
        self,
        here: InProcessProber,
        limit: int,
        prior: tuple[int, int],
        isolated: Callable[[], IsolatedProber],
        *,
        as_growth: bool = False,
    ):
        self.here = here
        self.limit, self.prior = limit, prior
        # The limit is a share of the memory free now, which this process's
        # own memory is already out of: a batch here reports what it adds,
        # as a child reports its own (a table read 745-780 MiB here beside
        # 99-282 MiB from children, in one search).
        self.as_growth = as_growth
        self._isolated = isolated
        self.child: IsolatedProber | None = None
        self._base = 0
        self._seen: list[tuple[int, int]] = []  # (batch, growth) probed here

    def __enter__(self) -> HeadroomProber:
        self._base = memory.resident_bytes() or 0
        return self

    def __exit__(self, *exc) -> None:
        self.here.__exit__(*exc)
        if self.child is not None:
            self.child.__exit__(*exc)

    def __call__(self, batch: int) -> ProbeResult:
        return self.sweep([batch])[0]

    def baseline_bytes(self) -> int | None:
        return self.child.baseline_bytes() if self.child is not None else None

    def predicted(self, batch: int, done: list[ProbeResult]) -> int:
        """The growth `batch` is predicted to add, after the batches `done`
        here (in this sweep) and before it."""
        fixed, per_sample = self.prior
        seen = self._seen + self._grown(done)
        return max([fixed + per_sample * batch, *(g * batch // b for b, g in seen)])

    def admits(self, batch: int, done: list[ProbeResult]) -> bool:
        return self.child is None and SAFETY * self.predicted(batch, done) <= (
            SHARE * self.limit
        )

    def _grown(self, results: list[ProbeResult]) -> list[tuple[int, int]]:
        return [
            (r.batch, max(0, r.peak_bytes - self._base))
            for r in results
            if r.outcome == OK and r.peak_bytes is not None
        ]

    def where(self) -> tuple[Reason, bool]:
        """Where the batches ran, in words, and whether in children."""
        if self.child is None:
            return Reason("isolate.far_below"), False
        if not self._seen:
            return Reason("isolate.children"), True
        batch = max(b for b, _ in self._seen)
        return Reason("isolate.here_then_children", batch=batch), True

    def sweep(self, batches: list[int]) -> list[ProbeResult]:
        results = self.here.sweep(batches, admit=self.admits)
        self._seen += self._grown(results)
        if self.as_growth:
            results = [
                r
                if r.peak_bytes is None
                else dataclasses.replace(
                    r, peak_bytes=max(0, r.peak_bytes - self._base)
                )
                for r in results
            ]
        rest = batches[len(results) :]
        if rest and (not results or results[-1].outcome == OK):
            if self.child is None:
                self.child = self._isolated().__enter__()
            results += self.child.sweep(rest)
        return results
