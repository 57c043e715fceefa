"""The batch-size search algorithm: the largest batch that does not run out
of memory, or the fastest within it. Pure: it asks a probe function whether
a batch fits and decides what to try next, so tests drive it with a
deterministic out-of-memory threshold.

Its design: docs/design/modules.md, `kerascale.measure.search`.
"""

from __future__ import annotations

from collections.abc import Callable

from kerascale._units import format_bytes
from kerascale.errors import BatchSizeSearchError
from kerascale.measure.memory_model import MemoryModel
from kerascale.measure.probe import ERROR, OK, ProbeResult
from kerascale.measure.result import BatchSearchResult, describe_probe
from kerascale.plan.reasons import Reason

MODES = ("max", "throughput")
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
            measured speed, under the memory bound; or "ladder" (internal):
            batches doubling from 32 to the memory bound or the cap, the
            largest that fits chosen.
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
    s = _Search(
        probe, sweep, cap, limit_bytes, max(1, granularity), max_trials, on_probe
    )
    try:
        if mode in ("throughput", "ladder"):
            s.throughput(plateau=mode == "throughput")
        else:
            if first is not None:
                s.run(min(first, cap))
            if s.lo < cap:
                s.largest(resolution=margin / 3)
    except _OutOfTrials:
        s.stopped = f"stopped after max_trials={max_trials} probes"
    return s.result(mode, margin)


class _OutOfTrials(Exception):
    pass


class _Search:
    """The state of one search: what fitted, what did not, the memory model."""

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

    def _known(self, batch: int) -> ProbeResult | None:
        return next((p for p in self.probes if p.batch == batch), None)

    def run(self, batch: int) -> ProbeResult:
        known = self._known(batch)
        if known:
            return known
        if len(self.probes) >= self.max_trials:
            raise _OutOfTrials
        return self._record(self.probe(batch))

    def run_many(self, batches: list[int]) -> list[ProbeResult]:
        """Increasing batches; stops at the first that does not fit."""
        todo = [b for b in batches if not self._known(b)]
        todo = todo[: max(0, self.max_trials - len(self.probes))]
        if todo:
            results = self._sweep(todo) if self._sweep else self._each(todo)
            for r in results:
                self._record(r)
        if len(todo) < len([b for b in batches if not self._known(b)]):
            raise _OutOfTrials
        return [self._known(b) for b in batches if self._known(b)]

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

    # The two modes.
    def largest(self, resolution: float = 0.0) -> None:
        """Finds the boundary: lo fits, hi does not, and hi - lo is at most
        one granule or `resolution` x lo.

        Two small batches (one child process) give the memory model. While
        nothing has failed, each next probe is the model's prediction from
        all that fitted so far (a far point corrects the slope that small
        batches only hint at), or, where the model says lo is already the
        edge, a step above lo that doubles from 1%. After a failure above a
        prediction, steps down from it double from 3% (a good prediction is
        confirmed in two or three probes, a poor one costs a few doublings).
        Bisection closes the bracket. Without a limit to predict against, the
        batch doubles until it does not fit.
        """
        small = sorted({min(self.cap, b) for b in (8 * self.g, 64 * self.g)})
        self.run_many([b for b in small if self.hi is None or b < self.hi])
        walk = max(self.g, self.down(0.01 * self.lo))
        while self.hi is None and 0 < self.lo < self.cap:
            guess = self.guess()
            if guess is None:
                nxt = 2 * self.lo
            elif guess >= self.lo + walk:
                nxt, walk = min(guess, 16 * self.lo), max(self.g, 0.01 * self.lo)
            else:  # the model says lo is the edge, but lo fits: walk up
                nxt, walk = self.lo + walk, 2 * walk
            self.run(min(self.cap, max(self.down(nxt), self.lo + 1)))
        last = self.probes[-1]
        if last.outcome == OK and self.hi is not None and self.lo:
            # The failure came first (a batch probed before the search): try
            # the model's prediction inside the bracket.
            guess = self.guess()
            if guess is not None and self.lo < self.down(guess) < self.hi:
                last = self.run(self.down(guess))
        if last.outcome != OK and self.lo:
            self._step_down(last.batch)
        self._close_in(resolution)

    def _step_down(self, p: int) -> None:
        """p did not fit: steps down from it, doubling from 3% of p, until a
        batch fits or the step would pass the middle of the bracket."""
        step = max(self.g, self.down(0.03 * p))
        while 2 * step < self.hi - self.lo:
            if self.run(self.down(self.hi - step)).outcome == OK:
                return
            step *= 2

    def _close_in(self, resolution: float = 0.0) -> None:
        """Bisection between the largest batch that fits and the smallest
        that does not, in granules (exactly, below ROUND_FROM), until they
        are one granule or `resolution` (a fraction of lo) apart."""
        while self.hi is not None:
            lo, hi = self.lo, self.hi
            step = self.step(lo)
            if hi - lo <= max(step, resolution * lo):
                break
            if lo == 0:  # nothing fits yet: halve
                nxt = self.down(hi / 2)
            else:
                nxt = self.down((lo + hi) / 2)
                if not lo < nxt < hi:
                    nxt = lo + step
            if not lo < nxt < hi:
                break
            self.run(nxt)

    def throughput(self, *, plateau: bool = True) -> None:
        """Doubles the batch from 32, timing each, until the speed stops
        growing (two doublings in a row gaining less than 3% over the fastest
        before them: one slower timing alone does not stop it), memory runs
        out, or the
        cap; then finds the memory bound if the speed was still growing
        there. Without `plateau`, the ladder runs on to the memory bound or
        the cap whatever the speeds (`fit` then times the rungs on the real
        data)."""
        flat = self._plateaued if plateau else lambda: False
        rungs = ladder(self.cap, self.g)
        for i in range(0, len(rungs), LADDER_CHUNK):
            self.run_many(rungs[i : i + LADDER_CHUNK])
            if self.hi is not None or flat():
                break
        if self.lo < self.cap and self.hi is None and not flat():
            self.run(self.cap)
        if plateau and self.hi is not None and self._best_batch() == self.lo:
            # Still speeding up when memory ran out: the bound matters, to
            # within 10% (speed barely changes closer in).
            self._close_in(resolution=0.1)

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
