"""What a batch-size search found: each probe (`ProbeResult`, its `Outcome`),
the model of peak memory fitted to them (`MemoryModel`), and the answer
(`BatchSearchResult`), and how they read. Pure: the search algorithm
(`search.py`) and every engine's prober share these, and none of them
imports an engine.

Peak memory of a training step grows about linearly with the batch: a fixed
part (weights, optimizer slots, the runtime) plus a part per sample
(activations kept for the backward pass). `MemoryModel` fits that line to a few
measured probes and predicts the largest batch under a limit; the batch search
then confirms the prediction by probing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kerascale import _validation as v
from kerascale._display import Table
from kerascale._units import format_bytes
from kerascale.plan.goodput import MIN_UPDATES


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """Peak memory = fixed_bytes + per_sample_bytes * batch.

    Attributes:
        fixed_bytes: Memory that does not grow with the batch.
        per_sample_bytes: Memory each sample of the (per-replica) batch adds.
        points: The (batch, peak bytes) measurements it was fitted to.
    """

    fixed_bytes: float
    per_sample_bytes: float
    points: tuple[tuple[int, int], ...] = ()

    def predict(self, batch: int) -> float:
        """Predicted peak bytes at `batch`."""
        return self.fixed_bytes + self.per_sample_bytes * batch

    def max_batch(self, limit_bytes: int) -> int | None:
        """The largest batch predicted to fit under `limit_bytes`; None when
        the model cannot tell (memory does not grow with the batch)."""
        if self.per_sample_bytes <= 0:
            return None
        return max(
            0, math.floor((limit_bytes - self.fixed_bytes) / self.per_sample_bytes)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixed_bytes": self.fixed_bytes,
            "per_sample_bytes": self.per_sample_bytes,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryModel:
        return cls(
            d["fixed_bytes"],
            d["per_sample_bytes"],
            tuple(tuple(p) for p in d.get("points", ())),
        )

    @classmethod
    def fit(cls, points: Sequence[tuple[int, int]]) -> MemoryModel | None:
        """Least-squares line through (batch, peak) points; None with fewer
        than two distinct batches."""
        pts = tuple((int(b), int(m)) for b, m in points)
        if len({b for b, _ in pts}) < 2:
            return None
        n = len(pts)
        mean_b = sum(b for b, _ in pts) / n
        mean_m = sum(m for _, m in pts) / n
        var = sum((b - mean_b) ** 2 for b, _ in pts)
        cov = sum((b - mean_b) * (m - mean_m) for b, m in pts)
        slope = cov / var
        return cls(mean_m - slope * mean_b, slope, pts)

    def __str__(self) -> str:
        return (
            f"{format_bytes(self.fixed_bytes)} + "
            f"{format_bytes(self.per_sample_bytes)} per sample"
        )


class Outcome(enum.StrEnum):
    """How a probe ended (a `str`: JSON and `== "ok"` read it as one)."""

    OK = "ok"
    OOM = "oom"  # memory ran out
    ERROR = "error"  # anything else


OK, OOM, ERROR = Outcome.OK, Outcome.OOM, Outcome.ERROR


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What one probe found.

    Attributes:
        batch: The per-replica batch tried.
        outcome: An `Outcome`: "ok", "oom" (memory ran out) or "error"
            (anything else); a string from a child's JSON is read as one.
        peak_bytes: Peak memory: per device on GPU, the process's resident
            memory on CPU; None when unknown (e.g. after a crash).
        seconds: Wall time of the probe, start-up included.
        samples_per_s: Training throughput across replicas, after warm-up.
        message: Why it failed, for "oom" and "error".
        tensor_peak_bytes: On CPU, the peak of TensorFlow's own allocator
            (tensors only): exact and linear in the batch, unlike the sampled
            process peak, so the memory model is fitted to it.
        timed_out: The probe ran past its time and was killed (an "error").
    """

    batch: int
    outcome: Outcome
    peak_bytes: int | None = None
    seconds: float = 0.0
    samples_per_s: float | None = None
    message: str = ""
    tensor_peak_bytes: int | None = None
    timed_out: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Rates:
    """What `kerascale.diagnose` times, in batches per second: the input
    alone, the step alone, training as `model.fit` runs it, and (JAX; NaN
    elsewhere) training with kerascale's host loader."""

    input: float
    step: float
    plain: float
    loaded: float


@dataclasses.dataclass(frozen=True)
class BatchSearchResult(Table):
    """What the batch-size search found, and what it was measured under.

    Pass it on to `fit` as it is: ``kerascale.fit(model, x,
    batch_size=result.batch_size, precision=result.precision)``.

    Attributes:
        batch_size: Samples per optimizer update across all replicas, Keras's
            meaning of `batch_size`: what to pass to `kerascale.fit`.
        per_replica_batch_size: The batch each replica holds,
            `batch_size / replicas`.
        replicas: Replicas the search was done for.
        precision: The dtype policy to train it under: the one the probes
            trained under, unless a CPU's trials timed the other faster at
            this batch (where it fits it); `reasons["precision"]` says which,
            with the figures.
        strategy: The distribution strategy the probes trained under.
        largest_fitting: The largest per-replica batch confirmed to fit (before
            the safety margin).
        smallest_failing: The smallest per-replica batch that ran out of
            memory, or None if the cap was reached first.
        mode: "max" or "throughput".
        probes: Every probe, in the order run.
        memory_model: The fitted memory model, or None.
        limit_bytes: The memory limit the search worked against.
        granularity: The step the batch was searched in.
        margin: The safety margin applied.
        reasons: Field -> why (a `kerascale.plan.reasons.Reason`; words
            alone in a result read back from the cache).
        cached: Whether the result came from the cache.
        recompute_batch_size: `batch_size` with recomputation (Keras's
            remat, fit's `recompute=True`), where `find_batch_size` found
            memory binding and searched again with it; else None.
        host_share: On a CPU, what the process where `fit` trains held
            beside the step when it was searched
            (`measure.host_share.HostShare.to_list`): a cached answer holds
            only for a process that holds no more. An answer a search took
            from the cache carries the share it measured in this process
            (no more than the cached one's, within its slack), which the
            decision's later searches count (`SearchRequest.host_share`).
        samples: The training samples the search was given, where known
            (`fit_kwargs` keeps an epoch's updates with it).
    """

    batch_size: int
    per_replica_batch_size: int
    replicas: int
    precision: str
    strategy: str
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
    recompute_batch_size: int | None = None
    host_share: tuple = ()
    samples: int | None = None

    def fit_kwargs(
        self,
        *,
        base_batch_size: int = 32,
        min_updates: int = MIN_UPDATES,
        callbacks: Any = (),
    ) -> dict[str, Any]:
        """The arguments of `kerascale.fit` (or `model.fit`, less
        `precision`) that train at this answer as well per second as Keras's
        defaults or better, not only faster per sample:

        - `batch_size`: this answer, or less where it would leave an epoch
          of `samples` fewer than `min_updates` updates (the largest batch
          that fits may be the whole of a small dataset: one update an
          epoch trains slowly whatever its samples per second);
        - `precision`: the one it was measured under;
        - `callbacks`: yours, then a `ScaledLearningRate` where that batch
          is larger than `base_batch_size`, the batch your learning rate was
          chosen at: SGD's rate scaled linearly with a warmup, the Adam
          family's by the square root, put back when `fit` ends.

        >>> result = kerascale.find_batch_size(model, x, y)
        >>> kerascale.fit(model, x, y, epochs=10,
        ...               **result.fit_kwargs(callbacks=[early_stopping]))

        Args:
            base_batch_size: The batch your learning rate was chosen at.
                Defaults to 32 (Keras's default batch).
            min_updates: The fewest updates an epoch keeps. Defaults to 16.
            callbacks: Your callbacks, put first in the list returned.

        Returns:
            A dict of `batch_size`, `precision` and `callbacks`.
        """
        from kerascale.callbacks.learning_rate import ScaledLearningRate

        v.positive_int("base_batch_size", base_batch_size)
        v.positive_int("min_updates", min_updates)
        batch = self.batch_size
        if self.samples:
            # An epoch keeps `min_updates` updates, in whole replicas, and the
            # batch never falls below your base (a small dataset's answer).
            keeps = self.samples // min_updates // self.replicas * self.replicas
            batch = min(batch, max(keeps, base_batch_size, self.replicas))
        if hasattr(callbacks, "set_model"):  # one callback, not a list
            callbacks = [callbacks]
        callbacks = list(callbacks or ())
        if batch > base_batch_size:
            callbacks.append(ScaledLearningRate(batch, base_batch_size))
        return {
            "batch_size": batch,
            "precision": self.precision,
            "callbacks": callbacks,
        }

    @property
    def global_batch_size(self) -> int:
        """The same as `batch_size` (all replicas), under the Plan's name."""
        return self.batch_size

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["probes"] = [p.to_dict() for p in self.probes]
        d["memory_model"] = self.memory_model.to_dict() if self.memory_model else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchSearchResult:
        d = dict(d)
        d["host_share"] = tuple(d.get("host_share") or ())
        d["probes"] = tuple(ProbeResult(**p) for p in d["probes"])
        d["memory_model"] = (
            MemoryModel.from_dict(d["memory_model"]) if d["memory_model"] else None
        )
        return cls(**d)

    def __str__(self) -> str:
        lines = [
            f"batch_size {self.batch_size} ({self.per_replica_batch_size} per "
            f"replica x {self.replicas}), measured under {self.precision} and the "
            f"{self.strategy} strategy ({self.reasons.get('batch_size', '')})",
            f"  limit {format_bytes(self.limit_bytes)}, memory model: "
            f"{self.memory_model or 'not fitted'}",
        ]
        if self.reasons.get("precision"):
            lines.append(f"  precision: {self.precision} ({self.reasons['precision']})")
        lines.append("  probes:")
        for p in self.probes:
            lines.append("    " + describe_probe(p))
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike) -> Path:
        """Draws peak memory and throughput against batch into `path` (PNG,
        SVG or PDF by extension). Needs matplotlib (`pip install "kerascale[plot]"`).

        Returns:
            The path written.
        """
        plt = _pyplot("plot")
        fig = self.figure()
        path = Path(path)
        fig.savefig(path)
        plt.close(fig)
        return path

    def figure(self) -> Any:
        """The plot of `plot` as a matplotlib `Figure` (a notebook shows it):
        peak memory of the batches that fit, the memory limit, the memory
        model, a line at each batch that did not fit, the chosen batch, and
        samples/s on its own axis, each in its own colour and in the legend.
        Needs matplotlib."""
        plt = _pyplot("figure")
        ok = sorted((p for p in self.probes if p.outcome == OK), key=lambda p: p.batch)
        bad = sorted(
            (p for p in self.probes if p.outcome == OOM), key=lambda p: p.batch
        )
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(
            [p.batch for p in ok],
            [(p.peak_bytes or 0) / 2**20 for p in ok],
            "o-",
            color="tab:blue",
            label="peak memory (fits)",
        )
        for i, p in enumerate(bad):
            label = "does not fit" if i == 0 else None
            ax.axvline(p.batch, color="tab:red", alpha=0.4, label=label)
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
                color="tab:purple",
                label="memory model",
            )
        ax.axvline(
            self.per_replica_batch_size,
            color="tab:green",
            label=f"chosen {self.per_replica_batch_size}",
        )
        ax.set_xlabel("batch per replica")
        ax.set_ylabel("peak memory (MiB)")
        handles, labels = ax.get_legend_handles_labels()
        speed = [p for p in ok if p.samples_per_s]
        if speed:
            ax2 = ax.twinx()
            ax2.plot(
                [p.batch for p in speed],
                [p.samples_per_s for p in speed],
                "s--",
                color="tab:orange",
                label="samples/s (right axis)",
            )
            ax2.set_ylabel("samples/s")
            more, names = ax2.get_legend_handles_labels()
            handles, labels = handles + more, labels + names
        ax.legend(handles, labels, loc="upper left", fontsize=8)
        fig.tight_layout()
        return fig


def _pyplot(method: str) -> Any:
    """matplotlib's pyplot, or an ImportError naming the `BatchSearchResult`
    method that needs it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            f"BatchSearchResult.{method}() needs matplotlib: "
            'pip install "kerascale[plot]" (or matplotlib)'
        ) from e
    return plt


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
