"""The batch-size search algorithm: the largest batch that does not run out
of memory, or the fastest within it. Pure: it asks a probe function whether
a batch fits and decides what to try next, so tests drive it with a
deterministic out-of-memory threshold.

Its design: docs/design/modules.md, `kerascale.measure.search`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kerascale._units import format_bytes
from kerascale.errors import BatchSizeSearchError
from kerascale.measure.result import (
    ERROR,
    OK,
    BatchSearchResult,
    MemoryModel,
    ProbeResult,
    describe_probe,
)
from kerascale.plan.reasons import Reason

THROUGHPUT_TOLERANCE = 0.03  # "within 3% of the best"
THROUGHPUT_START = 32  # Keras's default batch
# Rungs probed in one child process (`budget.search_seconds`): a child's start
# (TensorFlow's import, the model shipped and loaded) cost more than three
# rungs on the reference CNN of benchmarks/end_to_end.py (5 rungs in 2
# children 17-18 s, in 1 child 9 s), so the usual CPU ladder (32 to 1024)
# runs in one.
LADDER_CHUNK = 6


# Batches from ROUND_FROM up are searched and chosen in granules (tensor
# cores and vector units work in such tiles); below it, exactly: a granule of
# 8 is an eighth of a batch of 64 (a conv net's answer lost 12% to it).
ROUND_FROM = 512


def granule_at(batch: float, granule: int) -> int:
    """The step batches near `batch` are searched and chosen in: `granule`
    from ROUND_FROM up, else 1 (both searches round by this)."""
    return granule if batch >= ROUND_FROM else 1


def round_down(batch: float, granule: int) -> int:
    """`batch` rounded down to `granule_at` it, at least 1."""
    step = granule_at(batch, granule)
    return max(1, int(batch) // step * step)


def granularity_for(accelerator: str, cap: int) -> int:
    """The granule from ROUND_FROM up: 8 on GPUs and TPUs (tensor-core
    tiles); on CPU, exact for caps up to 1024, else 8."""
    if accelerator in ("gpu", "tpu"):
        return 8
    return 1 if cap <= 1024 else 8


# --- The algorithm ------------------------------------------------------------


def search(
    probe: Callable[[int], ProbeResult],
    *,
    cap: int,
    limit_bytes: int | None = None,
    granularity: int = 1,
    margin: float = 0.0,
    mode: str = "max",
    max_trials: int = 20,
    sweep: Callable[[list[int]], list[ProbeResult]] | None = None,
    on_probe: Callable[[ProbeResult], None] | None = None,
    first: int | None = None,
) -> BatchSearchResult:
    """Finds the largest batch `probe` accepts, up to `cap`. Pure but for
    `probe`, so tests drive it with a deterministic out-of-memory threshold.

    Args:
        probe: Runs one probe at a per-replica batch. Its exceptions pass
            through unchanged; a result with outcome "error" stops the search.
        cap: The largest batch worth trying (max_batch_size, dataset size).
        limit_bytes: The memory the batch must fit in, for the memory model's
            predictions; None to search by doubling and bisection alone.
        granularity: Batches are multiples of it (smaller ones only when even
            one granule does not fit).
        margin: Fraction kept free below the largest batch that fits. The
            boundary is resolved to a third of it (1% of the batch by
            default): finer would change nothing the margin does not hide.
            With margin 0, to the granule.
        mode: "max", or "throughput": the smallest batch within 3% of the best
            measured speed, under the memory bound.
        max_trials: The most probes to run.
        sweep: Runs several increasing batches at once, stopping at the first
            that does not fit (one child process for all). Defaults to calling
            `probe` in turn.
        on_probe: Called after each probe (progress lines).
        first: A batch to probe before anything else ("max" mode): a batch
            you want to use; if it fits and is the cap, one probe decides.

    Returns:
        A `BatchSearchResult` for one replica (the caller scales it).

    Raises:
        BatchSizeSearchError: If even a batch of 1 runs out of memory, or a
            probe fails for another reason.
    """
    s = Bracket(
        probe, sweep, cap, limit_bytes, max(1, granularity), max_trials, on_probe
    )
    try:
        if mode == "throughput":
            s.throughput()
        else:
            if first is not None:
                s.run(min(first, cap))
            if s.lo < cap:
                s.largest(MemoryModelGuide(margin / 3))
    except _OutOfTrials:
        s.stopped = f"stopped after max_trials={max_trials} probes"
    return s.result(mode, margin)


def bracket(
    probe: Callable[[int], ProbeResult],
    guide: Guide,
    *,
    cap: int,
    max_trials: int,
    limit_bytes: int | None = None,
    known: tuple[ProbeResult, ...] = (),
) -> Bracket:
    """The bracket alone, for an engine that answers from it itself (JAX's
    compiled search): lo is 0 where nothing fits, and no error is raised.
    `known`: probes made before, counted in `max_trials`."""
    b = Bracket(probe, None, cap, limit_bytes, 1, max_trials, None)
    for r in known:
        b._record(r)
    try:
        b.largest(guide)
    except _OutOfTrials:
        b.stopped = f"stopped after max_trials={max_trials} probes"
    return b


class _OutOfTrials(Exception):
    pass


class Bracket:
    """The state of one search, for every engine: what fitted (lo), what did
    not (hi), the probes and their budget, and the memory model; a `Guide`
    says where to look next."""

    def __init__(self, probe, sweep, cap, limit, g, max_trials, on_probe):
        self.probe, self._sweep = probe, sweep
        self.cap, self.limit, self.g = cap, limit, g
        self.max_trials, self.on_probe = max_trials, on_probe
        self.probes: list[ProbeResult] = []
        self.lo, self.hi = 0, None  # largest that fits, smallest that does not
        self.stopped = ""

    # Running probes.
    def _record(self, r: ProbeResult) -> ProbeResult:
        self.probes.append(r)
        if self.on_probe:
            self.on_probe(r)
        if r.outcome == ERROR:
            raise BatchSizeSearchError(
                f"The probe at batch {r.batch} failed for a reason other than "
                "memory, so the search stopped (the batch was not shrunk):\n"
                f"{r.message}",
                probe_message=r.message,
            )
        if r.outcome == OK:
            self.lo = max(self.lo, r.batch)
        else:
            self.hi = r.batch if self.hi is None else min(self.hi, r.batch)
        return r

    def probe_at(self, batch: int) -> ProbeResult | None:
        return next((p for p in self.probes if p.batch == batch), None)

    def run(self, batch: int) -> ProbeResult:
        known = self.probe_at(batch)
        if known:
            return known
        if len(self.probes) >= self.max_trials:
            raise _OutOfTrials
        return self._record(self.probe(batch))

    def run_many(self, batches: list[int]) -> list[ProbeResult]:
        """Increasing batches; stops at the first that does not fit."""
        todo = [b for b in batches if not self.probe_at(b)]
        todo = todo[: max(0, self.max_trials - len(self.probes))]
        if todo:
            results = self._sweep(todo) if self._sweep else self._each(todo)
            for r in results:
                self._record(r)
        if len(todo) < len([b for b in batches if not self.probe_at(b)]):
            raise _OutOfTrials
        return [self.probe_at(b) for b in batches if self.probe_at(b)]

    def _each(self, batches):
        out = []
        for b in batches:
            out.append(self.probe(b))
            if out[-1].outcome != OK:
                break
        return out

    # Rounding and the memory model.
    def down(self, b: float) -> int:
        return round_down(b, self.g)

    def step(self, b: int) -> int:
        return granule_at(b, self.g)

    def model(self) -> MemoryModel | None:
        return _refit(self.probes)

    def guess(self) -> int | None:
        m = self.model()
        if m is None or not self.limit:
            return None
        return m.max_batch(self.limit)

    # The bracket: one loop for every engine; a Guide says where to look.
    def largest(self, guide: Guide) -> None:
        """Finds the boundary: lo fits, hi does not, until `guide.closed`.

        The guide's opening batches run first (one sweep); then, while
        nothing has failed above lo, each next batch is the guide's step up
        (at most the cap); then, inside the bracket, the guide's guess, or
        its middle where the guide has none or it falls outside. A batch
        probed before ends the search (the guide has nothing new to ask).
        """
        self.run_many(
            [b for b in guide.opening(self) if self.hi is None or b < self.hi]
        )
        while self.hi is None and 0 < self.lo < self.cap and not guide.closed(self):
            nxt = self.down(guide.up(self))
            self.run(min(self.cap, max(nxt, self.lo + 1)))
        self.close_in(guide)

    def close_in(self, guide: Guide) -> None:
        """Narrows the bracket to `guide.closed`: the guide's guess inside it,
        else its middle (in granules; exactly, below ROUND_FROM)."""
        while self.hi is not None and not guide.closed(self):
            lo, hi = self.lo, self.hi
            nxt = guide.inside(self)
            if nxt is None or not lo < nxt < hi:
                nxt = self.middle()
            if not lo < nxt < hi or self.probe_at(nxt):
                break
            self.run(nxt)

    def middle(self) -> int:
        lo, hi = self.lo, self.hi
        if lo == 0:  # nothing fits yet: halve
            return self.down(hi / 2)
        nxt = self.down((lo + hi) / 2)
        return nxt if lo < nxt < hi else lo + self.step(lo)

    def throughput(self) -> None:
        """Doubles the batch from 32, timing each, until the speed stops
        growing (two doublings in a row gaining less than 3% over the fastest
        before them: one slower timing alone does not stop it), memory runs
        out, or the cap; then finds the memory bound if the speed was still
        growing there."""
        rungs = ladder(self.cap, self.g)
        for i in range(0, len(rungs), LADDER_CHUNK):
            self.run_many(rungs[i : i + LADDER_CHUNK])
            if self.hi is not None or self._plateaued():
                break
        if self.lo < self.cap and self.hi is None and not self._plateaued():
            self.run(self.cap)
        if self.hi is not None and self._best_batch() == self.lo:
            # Still speeding up when memory ran out: the bound matters, to
            # within 10% (speed barely changes closer in).
            self.close_in(Bisection(0.1))

    def _speeds(self) -> dict[int, float]:
        return {
            p.batch: p.samples_per_s
            for p in self.probes
            if p.outcome == OK and p.samples_per_s
        }

    def _best_batch(self) -> int | None:
        speeds = self._speeds()
        return max(speeds, key=speeds.get) if speeds else None

    def _plateaued(self) -> bool:
        speeds = sorted(self._speeds().items())
        if len(speeds) < 3:
            return False
        before = max(s for _, s in speeds[:-2])
        return all(s < (1 + THROUGHPUT_TOLERANCE) * before for _, s in speeds[-2:])

    def result(self, mode: str, margin: float) -> BatchSearchResult:
        lo, hi = self.lo, self.hi
        if lo == 0:
            limit = (
                f" under a limit of {format_bytes(self.limit)}" if self.limit else ""
            )
            raise BatchSizeSearchError(
                f"Even a batch of 1 runs out of memory{limit}. Raise memory_limit, "
                "use mixed precision, or make the model smaller. Probes: "
                + "; ".join(describe_probe(p) for p in self.probes),
                out_of_memory=True,
            )
        bound = f"{lo} fits, {hi} does not" if hi else f"the cap {self.cap} fits"
        if hi is None and lo < self.cap:
            bound = f"{lo} fits"
        if self.stopped:
            bound += f" ({self.stopped})"
        reasons = {}
        best = lo
        if margin > 0 and hi is not None:
            best = max(1, self.down(lo * (1 - margin)))
            reasons["margin"] = Reason(
                "search.margin", margin=margin, fits=lo, best=best
            )
        if mode == "throughput":
            speeds = {b: s for b, s in self._speeds().items() if b <= best}
            if speeds:
                best, why = fastest_small(speeds)
            else:
                why = Reason("search.untimed")
            reasons["batch_size"] = Reason("search.fastest", why=why, bound=bound)
        else:
            less = margin if best != lo else 0
            reasons["batch_size"] = Reason("search.largest", bound=bound, margin=less)
        return BatchSearchResult(
            batch_size=best,
            per_replica_batch_size=best,
            replicas=1,
            precision="",
            strategy="",
            largest_fitting=lo,
            smallest_failing=hi,
            mode=mode,
            probes=tuple(self.probes),
            memory_model=self.model(),
            limit_bytes=self.limit,
            granularity=self.step(best),
            margin=margin,
            reasons=reasons,
        )


class Guide(Protocol):
    """Where a search looks next. The bracket (what fits, what does not, the
    probes' budget) is `Bracket`'s, the same for every engine; a guide is
    what differs: TensorFlow's real probes are guided by a memory model
    fitted to them, JAX's compiled steps by a secant through XLA's counts
    (`kerascale.measure.jax.compiled`)."""

    def opening(self, s: Bracket) -> list[int]:
        """The batches to probe first, increasing (one sweep)."""

    def up(self, s: Bracket) -> int:
        """The next batch while nothing above `s.lo` has failed."""

    def inside(self, s: Bracket) -> int | None:
        """The next batch inside the bracket; None for its middle."""

    def closed(self, s: Bracket) -> bool:
        """Whether the bracket is narrow enough."""


class Bisection:
    """Bisects the bracket to one granule or `resolution` x lo."""

    def __init__(self, resolution: float = 0.0):
        self.resolution = resolution

    def opening(self, s: Bracket) -> list[int]:
        return []

    def up(self, s: Bracket) -> int:
        return 2 * s.lo

    def inside(self, s: Bracket) -> int | None:
        return None

    def closed(self, s: Bracket) -> bool:
        return s.hi is not None and s.hi - s.lo <= max(
            s.step(s.lo), self.resolution * s.lo
        )


class MemoryModelGuide(Bisection):
    """TensorFlow's guide: real probes, and the memory model fitted to them.

    Two small batches (one child process) give the model. While nothing has
    failed, each next probe is the model's prediction from all that fitted
    so far (a far point corrects the slope that small batches only hint at),
    or, where the model says lo is already the edge, a step above lo that
    doubles from 1%; without a limit to predict against, the batch doubles.
    Inside the bracket: where the failure came first (a batch probed before
    the search), the model's prediction once; after a failure, steps down
    from it doubling from 3% (a good prediction is confirmed in two or three
    probes, a poor one costs a few doublings), until a batch fits or the
    step would pass the middle; then bisection.
    """

    def __init__(self, resolution: float = 0.0):
        super().__init__(resolution)
        self.walk = 0
        self.stage = "enter"
        self.down_step = 0

    def opening(self, s: Bracket) -> list[int]:
        return sorted({min(s.cap, b) for b in (8 * s.g, 64 * s.g)})

    def up(self, s: Bracket) -> int:
        self.walk = self.walk or max(s.g, s.down(0.01 * s.lo))
        guess = s.guess()
        if guess is None:
            return 2 * s.lo
        if guess >= s.lo + self.walk:
            nxt = min(guess, 16 * s.lo)
            self.walk = max(s.g, 0.01 * s.lo)
        else:  # the model says lo is the edge, but lo fits: walk up
            nxt, self.walk = s.lo + self.walk, 2 * self.walk
        return nxt

    def inside(self, s: Bracket) -> int | None:
        last = s.probes[-1]
        if self.stage == "enter":
            self.stage = "failed"
            if last.outcome == OK and s.lo:
                # The failure came first: the model's prediction inside.
                guess = s.guess()
                if guess is not None and s.lo < s.down(guess) < s.hi:
                    return s.down(guess)
        if self.stage == "failed":
            self.stage = "bisect"
            if last.outcome != OK and s.lo:
                self.stage = "stepping"
                self.down_step = max(s.g, s.down(0.03 * last.batch))
                return self._step_down(s)
        elif self.stage == "stepping":
            if last.outcome == OK:
                self.stage = "bisect"
            else:
                self.down_step *= 2
                return self._step_down(s)
        return None

    def _step_down(self, s: Bracket) -> int | None:
        if 2 * self.down_step < s.hi - s.lo:
            return s.down(s.hi - self.down_step)
        self.stage = "bisect"
        return None


def ladder(cap: int, granularity: int = 1) -> list[int]:
    """The throughput search's rungs when nothing stops it: doublings from
    Keras's default batch (smaller ones are rarely faster, and their timings
    are the noisiest), or the cap, up to the cap, then the cap itself."""
    g = max(1, granularity)
    b = min(max(g, THROUGHPUT_START // g * g), cap)
    rungs = []
    while b <= cap:
        rungs.append(b)
        b *= 2
    if rungs[-1] < cap:
        rungs.append(cap)
    return rungs


def fastest_small(speeds: dict[int, float]) -> tuple[int, Reason]:
    """The smallest batch within THROUGHPUT_TOLERANCE of the best of
    `speeds` ({batch: samples/s}, measured by the probes), and why."""
    speeds = {b: s for b, s in speeds.items() if s} or dict.fromkeys(speeds, 0.0)
    top = max(speeds.values())
    if not top:  # rungs that no probe timed (XLA's search runs none)
        return min(speeds), Reason("search.none_timed")
    best = min(b for b, s in speeds.items() if s >= (1 - THROUGHPUT_TOLERANCE) * top)
    fastest = max(speeds, key=speeds.get)
    if best == fastest:
        return best, Reason("search.fastest_timed", speed=top)
    return best, Reason(
        "search.within_tolerance",
        tolerance=THROUGHPUT_TOLERANCE,
        fastest=fastest,
        speed=speeds[best],
        top=top,
    )


def _refit(probes: list[ProbeResult]) -> MemoryModel | None:
    """The memory model from the probes that fitted.

    Where TensorFlow's allocator peak is known (CPU), the line is fitted to it,
    which is exact and linear in the batch, and lifted by the largest gap seen
    between the process's peak and the allocator's (the runtime, threads,
    caches): the sampled process peak alone moves in steps as allocators grow
    their arenas, and misleads a fit from small batches.
    """
    ok = [p for p in probes if p.outcome == OK and p.peak_bytes]
    if ok and all(p.tensor_peak_bytes for p in ok):
        tensors = MemoryModel.fit([(p.batch, p.tensor_peak_bytes) for p in ok])
        if tensors is None:
            return None
        overhead = max(p.peak_bytes - p.tensor_peak_bytes for p in ok)
        return MemoryModel(
            tensors.fixed_bytes + overhead,
            tensors.per_sample_bytes,
            tuple((p.batch, p.peak_bytes) for p in ok),
        )
    return MemoryModel.fit([(p.batch, p.peak_bytes) for p in ok])
