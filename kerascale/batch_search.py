"""Batch-size search: the largest batch that does not run out of memory.

The algorithm (`search`) is pure: it asks a probe function whether a batch
fits and decides what to try next.

1. Probe a few small batches and fit a memory model (fixed + per sample).
2. Predict the largest batch under the memory limit and probe it.
3. Close in on the boundary between the largest batch that fitted and the
   smallest that did not, guided by the model refitted on every measurement
   (and by plain bisection when the model misleads), down to a granularity:
   8 on accelerators, 1 on CPU for small caps.
4. Keep a small safety margin below the boundary, and say so.

`find_batch_size` wires it to real probes (`kerascale.probe`), the plan's
precision and strategy, a cache, and progress lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerascale import _validation
from kerascale import strategy as strategy_lib
from kerascale.errors import BatchSizeSearchError
from kerascale.memory import MemoryModel, format_bytes
from kerascale.probe import ERROR, OK, OOM, ProbeResult

logger = logging.getLogger("kerascale")

MODES = ("max", "throughput")
THROUGHPUT_TOLERANCE = 0.03  # "within 3% of the best"
THROUGHPUT_START = 32  # Keras's default batch
THROUGHPUT_TIMED_SECONDS = 1.0  # per probe; 0.3 s timings varied by 20% on 2 cores


@dataclasses.dataclass(frozen=True)
class BatchSearchResult:
    """What the batch-size search found.

    Attributes:
        batch_size: The chosen per-replica batch.
        global_batch_size: `batch_size * replicas`.
        replicas: Replicas the search was done for.
        largest_fitting: The largest per-replica batch confirmed to fit (before
            the safety margin).
        smallest_failing: The smallest batch that ran out of memory, or None if
            the cap was reached first.
        mode: "max" or "throughput".
        probes: Every probe, in the order run.
        memory_model: The fitted memory model, or None.
        limit_bytes: The memory limit the search worked against.
        granularity: The step the batch was searched in.
        margin: The safety margin applied.
        reasons: Field -> why.
        cached: Whether the result came from the cache.
    """

    batch_size: int
    global_batch_size: int
    replicas: int
    largest_fitting: int
    smallest_failing: int | None
    mode: str
    probes: tuple[ProbeResult, ...]
    memory_model: MemoryModel | None
    limit_bytes: int | None
    granularity: int
    margin: float
    reasons: dict[str, str]
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["probes"] = [p.to_dict() for p in self.probes]
        d["memory_model"] = self.memory_model.to_dict() if self.memory_model else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchSearchResult:
        d = dict(d)
        d["probes"] = tuple(ProbeResult(**p) for p in d["probes"])
        d["memory_model"] = (
            MemoryModel.from_dict(d["memory_model"]) if d["memory_model"] else None
        )
        return cls(**d)

    def __str__(self) -> str:
        lines = [
            f"batch size {self.batch_size} per replica x {self.replicas} = "
            f"{self.global_batch_size} ({self.reasons.get('batch_size', '')})",
            f"  limit {format_bytes(self.limit_bytes)}, memory model: "
            f"{self.memory_model or 'not fitted'}",
            "  probes:",
        ]
        for p in self.probes:
            lines.append("    " + describe_probe(p))
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike) -> Path:
        """Draws peak memory and throughput against batch into `path` (PNG,
        SVG or PDF by extension). Needs matplotlib (`pip install matplotlib`).

        Returns:
            The path written.
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError(
                "BatchSearchResult.plot needs matplotlib: pip install matplotlib"
            ) from e
        ok = sorted((p for p in self.probes if p.outcome == OK), key=lambda p: p.batch)
        bad = sorted(
            (p for p in self.probes if p.outcome == OOM), key=lambda p: p.batch
        )
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(
            [p.batch for p in ok],
            [(p.peak_bytes or 0) / 2**20 for p in ok],
            "o-",
            label="peak memory (fits)",
        )
        for p in bad:
            ax.axvline(p.batch, color="tab:red", alpha=0.4)
        if self.limit_bytes:
            ax.axhline(
                self.limit_bytes / 2**20, color="tab:red", ls="--", label="memory limit"
            )
        if self.memory_model and ok:
            xs = [0, max(p.batch for p in self.probes)]
            ax.plot(
                xs,
                [self.memory_model.predict(b) / 2**20 for b in xs],
                ":",
                label="memory model",
            )
        ax.axvline(
            self.batch_size, color="tab:green", label=f"chosen {self.batch_size}"
        )
        ax.set_xlabel("batch per replica")
        ax.set_ylabel("peak memory (MiB)")
        speed = [p for p in ok if p.samples_per_s]
        if speed:
            ax2 = ax.twinx()
            ax2.plot(
                [p.batch for p in speed],
                [p.samples_per_s for p in speed],
                "s--",
                color="tab:orange",
                label="samples/s",
            )
            ax2.set_ylabel("samples/s")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path)
        plt.close(fig)
        return path


def describe_probe(p: ProbeResult) -> str:
    """One line: "batch 256: ok, peak 1.20 GiB, 1640 samples/s, 4.1s"."""
    parts = [f"batch {p.batch}: {p.outcome}"]
    if p.peak_bytes is not None:
        parts.append(f"peak {format_bytes(p.peak_bytes)}")
    if p.samples_per_s:
        parts.append(f"{p.samples_per_s:.0f} samples/s")
    parts.append(f"{p.seconds:.1f}s")
    text = ", ".join(parts)
    if p.outcome != OK and p.message:
        text += f" ({p.message.splitlines()[0][:120]})"
    return text


def granularity_for(accelerator: str, cap: int) -> int:
    """8 on GPUs and TPUs (tensor-core tiles); on CPU, exact for caps up to
    1024, else 8."""
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
                f"{r.message}"
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
        """Rounds down to the granularity; below one granule, to 1."""
        return int(b) // self.g * self.g if b >= self.g else max(1, int(b))

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
        that does not, in granules (exactly, below one granule), until they
        are one granule or `resolution` (a fraction of lo) apart."""
        while self.hi is not None:
            lo, hi = self.lo, self.hi
            step = self.g if lo >= self.g else 1
            if hi - lo <= max(step, resolution * lo):
                break
            if lo == 0:  # nothing fits yet: halve
                nxt = self.down(hi / 2) if hi > self.g else hi // 2
            else:
                nxt = self.down((lo + hi) / 2)
                if not lo < nxt < hi:
                    nxt = lo + step
            if not lo < nxt < hi:
                break
            self.run(nxt)

    def throughput(self, *, plateau: bool = True) -> None:
        """Doubles the batch from 32, timing each, until the speed stops
        growing (two doublings gaining less than 3%), memory runs out, or the
        cap; then finds the memory bound if the speed was still growing
        there. Without `plateau`, the ladder runs on to the memory bound or
        the cap whatever the speeds (`fit` then times the rungs on the real
        data)."""
        # From Keras's default batch (smaller ones are rarely faster, and their
        # timings are the noisiest), or the cap.
        b = max(self.g, THROUGHPUT_START // self.g * self.g)
        if b > self.cap:
            b = self.cap
        flat = self._plateaued if plateau else lambda: False
        while b <= self.cap:
            chunk = []
            while b <= self.cap and len(chunk) < 3:
                chunk.append(b)
                b *= 2
            self.run_many(chunk)
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
                + "; ".join(describe_probe(p) for p in self.probes)
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
            reasons["margin"] = f"{margin:.0%} of {lo} kept free for safety: {best}"
        if mode == "throughput":
            speeds = {b: s for b, s in self._speeds().items() if b <= best}
            if speeds:
                top = max(speeds.values())
                best = min(
                    b
                    for b, s in speeds.items()
                    if s >= (1 - THROUGHPUT_TOLERANCE) * top
                )
                why = (
                    f"smallest batch within {THROUGHPUT_TOLERANCE:.0%} of the best "
                    f"measured throughput ({speeds[best]:.0f} vs {top:.0f} samples/s)"
                )
            else:
                why = "no throughput measured: the memory bound"
            reasons["batch_size"] = f"{why}; memory: {bound}"
        else:
            reasons["batch_size"] = f"largest that fits: {bound}" + (
                f", less the {margin:.0%} margin" if best != lo else ""
            )
        return BatchSearchResult(
            batch_size=best,
            global_batch_size=best,
            replicas=1,
            largest_fitting=lo,
            smallest_failing=hi,
            mode=mode,
            probes=tuple(self.probes),
            memory_model=self.model(),
            limit_bytes=self.limit,
            granularity=self.g,
            margin=margin,
            reasons=reasons,
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


# --- Cache ----------------------------------------------------------------------


def cache_dir() -> Path:
    """$KERASCALE_CACHE_DIR, else $XDG_CACHE_HOME/kerascale, else ~/.cache/kerascale."""
    if os.environ.get("KERASCALE_CACHE_DIR"):
        return Path(os.environ["KERASCALE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "kerascale"


def cache_key(parts: dict[str, Any]) -> str:
    """A key for `parts`, with the TensorFlow, Keras and kerascale versions
    added: a measured decision does not outlive an upgrade."""
    import keras
    import tensorflow as tf

    from kerascale import __version__

    versions = [tf.__version__, keras.__version__, __version__]
    text = json.dumps({**parts, "versions": versions}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_read(kind: str, key: str) -> dict[str, Any] | None:
    """The cached entry `kind/key`, or None if absent or unreadable."""
    try:
        return json.loads((cache_dir() / kind / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def cache_write(kind: str, key: str, payload: dict[str, Any]) -> None:
    """Stores `payload` as `kind/key`, atomically; a cache that cannot be
    written is logged, never fatal (a read-only home must not stop training)."""
    folder = cache_dir() / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, folder / f"{key}.json")
    except OSError as e:
        logger.warning("kerascale's %s cache not written (%s).", kind, e)


def cache_load(key: str) -> BatchSearchResult | None:
    d = cache_read("batch_search", key)
    try:
        return dataclasses.replace(BatchSearchResult.from_dict(d), cached=True)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # absent or unreadable: search again


def cache_store(key: str, result: BatchSearchResult) -> None:
    cache_write("batch_search", key, result.to_dict())


# --- Options, and running a search for a plan -----------------------------------

# Without max_batch_size or a known dataset size, the search stops here.
HARD_CAP = 65536
DEFAULT_MARGIN = 0.03
# On CPU without memory_limit, probes may use this share of available memory.
CPU_DEFAULT_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Validated batch-search options (see `find_batch_size`)."""

    mode: str = "auto"
    isolate: Any = "auto"
    memory_limit: int | None = None
    max_batch_size: int | None = None
    steps_per_trial: int = 3
    margin: float = DEFAULT_MARGIN
    max_trials: int = 20
    timeout: float = 600.0
    cache: bool = True
    force: bool = False
    # Optimizer updates an epoch must keep: fit's "auto" asks for several, so
    # that a small dataset is not swallowed by one huge batch.
    min_steps_per_epoch: int = 1

    @classmethod
    def validate(cls, **kwargs: Any) -> SearchOptions:
        """Checks every option at the door; raises `ConfigurationError`."""
        from kerascale.memory import parse_bytes

        o = cls(**kwargs)
        _validation.one_of("mode", o.mode, ("auto", *MODES))
        if o.isolate != "auto" and not isinstance(o.isolate, bool):
            raise _validation.fail("isolate", o.isolate, '"auto", True or False')
        limit = (
            None
            if o.memory_limit is None
            else parse_bytes("memory_limit", o.memory_limit)
        )
        if o.max_batch_size is not None:
            _validation.positive_int(
                "max_batch_size", o.max_batch_size, accepted="a positive int or None"
            )
        _validation.positive_int("steps_per_trial", o.steps_per_trial)
        m = o.margin
        if (
            isinstance(m, bool)
            or not isinstance(m, int | float)
            or math.isnan(m)
            or not 0 <= m < 0.5
        ):
            raise _validation.fail("margin", m, "a fraction in [0, 0.5)")
        _validation.positive_int("max_trials", o.max_trials)
        t = o.timeout
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise _validation.fail("timeout", t, "a positive number of seconds")
        _validation.boolean("cache", o.cache)
        _validation.boolean("force", o.force)
        return dataclasses.replace(o, memory_limit=limit)


def _limit_for(hw: Any, options: SearchOptions) -> tuple[int | None, str]:
    from kerascale.memory import available_bytes

    if options.memory_limit:
        where = "per GPU" if hw.accelerator == "gpu" else "data memory per probe"
        return options.memory_limit, f"memory_limit you passed ({where})"
    if hw.accelerator == "gpu":
        sizes = [g.memory_total for g in hw.gpus]
        if all(sizes):
            return min(sizes), "GPU memory from NVML (smallest GPU)"
        return None, "GPU memory unknown (no NVML): found by probing alone"
    if hw.accelerator == "tpu":
        return None, "TPU memory unknown: found by probing alone"
    avail = available_bytes()
    if avail is None:
        return None, "available memory unknown: found by probing alone"
    limit = int(avail * CPU_DEFAULT_SHARE)
    return limit, (
        f"{CPU_DEFAULT_SHARE:.0%} of the memory available now "
        f"({format_bytes(avail)}), so that probing cannot exhaust the machine"
    )


def _cap_for(data: Any, plan: Any, options: SearchOptions) -> tuple[int, str]:
    caps = [(HARD_CAP, f"kerascale's ceiling of {HARD_CAP}")]
    if options.max_batch_size:
        caps.append((options.max_batch_size // plan.replicas or 1, "max_batch_size"))
    if data.num_samples:
        steps = options.min_steps_per_epoch
        per_replica = max(1, data.num_samples // (plan.replicas * steps))
        why = (
            "the dataset size"
            if steps == 1
            else f"1/{steps} of the dataset, so that an epoch keeps {steps} updates"
        )
        caps.append((per_replica, why))
    return min(caps)


def model_fingerprint(model: Any) -> str:
    """What identifies a model for the caches: its architecture and compile
    config with automatic names canonicalised (a builder: its qualified name)."""
    from kerascale import precision

    if precision.is_builder(model):
        target = f"{model.__module__}.{model.__qualname__}"
        return hashlib.sha256(target.encode()).hexdigest()
    try:
        arch = json.dumps(_canonical_names(json.loads(model.to_json())), sort_keys=True)
    except Exception:  # subclassed without get_config: its shapes stand in
        arch = type(model).__qualname__ + repr([tuple(w.shape) for w in model.weights])
    try:
        compiled = json.dumps(
            _canonical_names(model.get_compile_config()), sort_keys=True, default=str
        )
    except Exception:
        compiled = repr(getattr(model, "optimizer", None))
    return hashlib.sha256((arch + compiled).encode()).hexdigest()


def _canonical_names(config: Any) -> Any:
    """The model's config with layer and model names replaced by their order
    of appearance: Keras numbers automatic names per session ("dense_3"), and
    a model rebuilt in a notebook cell must still find its cached search."""
    names: dict[str, str] = {}

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            cls = str(node.get("class_name", ""))
            inner = node.get("config")
            if isinstance(inner, dict) and "Policy" not in cls:
                name = inner.get("name")
                if isinstance(name, str) and name not in names:
                    names[name] = f"#{len(names)}"
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    def rename(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: rename(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rename(v) for v in node]
        if isinstance(node, str):
            return names.get(node, node)
        return node

    collect(config)
    return rename(config)


def run_search(
    model: Any,
    x: Any,
    y: Any,
    data: Any,
    plan: Any,
    hw: Any,
    options: SearchOptions,
    *,
    instance: Any = None,
    verbose: Any = "auto",
    first: int | None = None,
    accumulation_steps: int | None = None,
) -> BatchSearchResult:
    """Searches the per-replica batch for `plan` (its precision, strategy and
    accumulation, or `accumulation_steps`) on this hardware, with real
    probes, probing `first` before anything else. Uses the cache."""

    from kerascale import data as data_lib
    from kerascale import precision, probe
    from kerascale.probe import InProcessProber, IsolatedProber, ProbeSpec

    limit, why_limit = _limit_for(hw, options)
    cap, why_cap = _cap_for(data, plan, options)
    g = granularity_for(hw.accelerator, cap)
    mode = options.mode
    if mode == "auto":
        mode = "throughput" if hw.accelerator == "cpu" else "max"
    element = data_lib.element_structure(x, y, data)
    spec = ProbeSpec(
        element=probe.encode_structure(element),
        policy=plan.precision,
        # A worker of a cluster probes alone, on its own devices.
        strategy=strategy_lib.local_equivalent(plan.strategy, tuple(plan.devices)),
        devices=tuple(plan.devices),
        logical_cpus=hw.cpu.logical_devices,
        steps=options.steps_per_trial,
        validate=True,
        accumulation_steps=accumulation_steps or plan.accumulation_steps,
        memory_limit=limit,
        on_gpu=hw.accelerator == "gpu",
        # Speed decides in throughput mode: time each probe long enough.
        timed_seconds=THROUGHPUT_TIMED_SECONDS
        if mode == "throughput"
        else probe.MIN_TIMED_SECONDS,
    )
    key = cache_key(
        {
            "model": model_fingerprint(model),
            # The limit as asked for: a default limit follows the memory free
            # at this moment, which must not make every search a cache miss.
            "spec": dataclasses.replace(
                spec, memory_limit=options.memory_limit
            ).to_json(),
            "hardware": hw.to_dict(),
            "mode": mode,
            "cap": cap,
            "first": first,
            "margin": options.margin,
        }
    )
    if options.cache and not options.force:
        cached = cache_load(key)
        if cached is not None:
            if verbose != 0:
                print(
                    f"kerascale: batch size {cached.batch_size} per replica from "
                    f"the cache ({cache_dir()})",
                    flush=True,
                )
            return cached

    isolate, why_isolate = options.isolate, ""
    # A child needs a model instance to save; a builder is called once for it.
    shipped = model() if isolate is not False and precision.is_builder(model) else model
    if isolate == "auto":
        if instance is not None:
            isolate, why_isolate = False, "your strategy instance lives in this process"
        elif hw.accelerator == "tpu":
            isolate, why_isolate = False, "a TPU serves one process at a time"
        else:
            _, problem = probe.custom_objects(shipped)
            isolate = not problem
            why_isolate = (
                "each probe in a child process"
                if isolate
                else f"in this process: the model cannot be shipped ({problem})"
            )
    elif isolate:
        why_isolate = "isolate=True"
    else:
        why_isolate = "isolate=False"

    def progress(r: ProbeResult) -> None:
        if verbose != 0:
            print(f"kerascale: batch search: {describe_probe(r)}", flush=True)

    if verbose != 0:
        print(
            f"kerascale: searching the batch size ({mode}, up to {cap} per replica, "
            f"limit {format_bytes(limit)})...",
            flush=True,
        )
    if isolate:
        prober = IsolatedProber(shipped, spec, timeout=options.timeout)
    else:
        prober = InProcessProber(model, spec, strategy=instance)
    with prober:
        try:
            found = search(
                prober,
                cap=cap,
                limit_bytes=limit,
                granularity=g,
                margin=options.margin,
                mode=mode,
                max_trials=options.max_trials,
                sweep=prober.sweep,
                on_probe=progress,
                first=first,
            )
        except BatchSizeSearchError as e:
            baseline = prober.baseline_bytes()
            if baseline and str(e).startswith("Even a batch of 1"):
                raise BatchSizeSearchError(
                    f"{e}\nTensorFlow and the model alone took "
                    f"{format_bytes(baseline)} of data memory before the first "
                    "batch; memory_limit must leave room above that."
                ) from None
            raise
    seconds = sum(p.seconds for p in found.probes)
    reasons = {
        **found.reasons,
        "limit": why_limit,
        "cap": why_cap,
        "isolate": why_isolate,
        "search": f"{len(found.probes)} probes, {seconds:.0f}s",
    }
    result = dataclasses.replace(
        found,
        replicas=plan.replicas,
        global_batch_size=found.batch_size * plan.replicas,
        reasons=reasons,
    )
    if options.cache:
        cache_store(key, result)
    return result


def find_batch_size(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    mode: str = "max",
    isolate: Any = "auto",
    memory_limit: int | str | None = None,
    max_batch_size: int | None = None,
    steps_per_trial: int = 3,
    margin: float = DEFAULT_MARGIN,
    max_trials: int = 20,
    timeout: float = 600.0,
    cache: bool = True,
    force: bool = False,
    strategy: Any = "auto",
    precision: str = "auto",
    verbose: Any = "auto",
) -> BatchSearchResult:
    """Finds the largest batch that trains without running out of memory.

    Each probe is a real training step (forward, backward and optimizer update,
    then a validation step) on a synthetic batch shaped like your data, under
    the precision and strategy `kerascale.fit` would use. Probes run in child
    processes where the model can be shipped there (`isolate="auto"`), so an
    out-of-memory crash never harms this process, and on CPU `memory_limit` is
    enforced for real. The search fits a memory model to a few small probes,
    jumps to its prediction, and confirms the boundary by probing around it.
    Results are cached per model, hardware, precision and input shape.

    Args:
        model: A compiled Keras model, or a function that builds one.
        x: Training data as for `kerascale.fit` (a dataset or arrays); only
            its shapes and size are used.
        y: Targets, when `x` is arrays.
        mode: "max": the largest batch that fits, less `margin`.
            "throughput": the smallest batch within 3% of the best measured
            samples/s under the memory bound. Defaults to "max".
        isolate: True: probes in child processes; False: in this process
            (catching `ResourceExhaustedError`); "auto": children where the
            model can be shipped (its custom objects importable). Defaults to
            "auto".
        memory_limit: Bytes, or a size like "6GiB": per GPU on GPUs, the
            probe process's data memory on CPU. Defaults to `None`: the GPU's
            memory, or 80% of the memory available on CPU.
        max_batch_size: The largest global batch to consider. Defaults to
            `None` (the dataset size, at most 65536).
        steps_per_trial: Training steps per probe (the first is a warm-up).
            Defaults to 3.
        margin: Fraction kept free below the largest batch that fits.
            Defaults to 0.03.
        max_trials: The most probes to run. Defaults to 20.
        timeout: Seconds one probe may take before it is killed. Defaults
            to 600.
        cache: Read and write the result cache. Defaults to `True`.
        force: Search again even when a cached result exists. Defaults to
            `False`.
        strategy: As in `kerascale.fit`. Defaults to "auto".
        precision: As in `kerascale.fit`. Defaults to "auto".
        verbose: 0 prints nothing; otherwise a line per probe. Defaults to
            "auto".

    Returns:
        A `BatchSearchResult`: `.batch_size` (per replica),
        `.global_batch_size`, `.probes`, `.memory_model`, `.reasons`.

    Raises:
        ConfigurationError: For an invalid argument (the message names it).
        BatchSizeSearchError: If even a batch of 1 does not fit, or a probe
            fails for a reason other than memory.

    Example:

    >>> result = kerascale.find_batch_size(model, x, y, memory_limit="4GiB")
    >>> result.batch_size, len(result.probes)
    """
    from kerascale.decide import decide
    from kerascale.planning import Options

    options = Options.validate(strategy=strategy, precision=precision, verbose=verbose)
    _validation.one_of("mode", mode, MODES)
    search = SearchOptions.validate(
        mode=mode,
        isolate=isolate,
        memory_limit=memory_limit,
        max_batch_size=max_batch_size,
        steps_per_trial=steps_per_trial,
        margin=margin,
        max_trials=max_trials,
        timeout=timeout,
        cache=cache,
        force=force,
    )
    return decide(model, x, y, options, search=search, force_search=True).search
