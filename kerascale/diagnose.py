"""`kerascale.diagnose`: is training input-, compute- or memory-bound, and what
to change.

Measured on the user's own model and data at the planned settings: the input
pipeline alone, one training step alone (on a cached batch), the two together
as training runs them, and memory at the planned batch (from the batch-size
check's probes, when a memory limit applies). A copy of the model trains; the
user's model is not touched.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import keras

from kerascale import _validation as v
from kerascale._tf import tf
from kerascale._units import format_bytes
from kerascale.apply import model as model_lib
from kerascale.apply.session import Session, prepare
from kerascale.errors import UnsupportedError
from kerascale.measure.decide import decide, validate_options
from kerascale.sense import backend as backend_lib
from kerascale.sense import data_facts

WARMUP_STEPS = 3
MEMORY_BOUND_HEADROOM = 0.10  # less free memory than this at the planned batch
INPUT_BOUND_SHARE = 0.85  # training slower than this share of the step alone
# ...and an input pipeline not this much faster than the step: even read in
# turn with the step (no prefetch), a pipeline 5x faster takes at most 1/6 of
# the time, so a slower training rate is noise, not input.
INPUT_BOUND_MAX_RATIO = 5.0


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """One change to make: what, the expected speed-up (x, when it can be
    estimated from the measurements), and why."""

    action: str
    expected_gain: float | None
    why: str

    def __str__(self) -> str:
        gain = (
            f"up to {self.expected_gain:.1f}x" if self.expected_gain else "gain unknown"
        )
        return f"{self.action} ({gain}): {self.why}"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What bounds training here, the numbers behind it, and what to change.

    Attributes:
        bound: "input", "compute" or "memory".
        input_batches_per_s: The input pipeline alone, no model.
        step_batches_per_s: Training steps alone, on one cached batch.
        training_batches_per_s: The two together, as training runs.
        batch_size: Samples per step (all replicas).
        memory_peak_bytes: Peak memory of a training step at the planned
            batch (per device on GPUs), when measured.
        memory_limit_bytes: The memory it must fit in, when known.
        recommendations: Ranked, most promising first.
        plan: The plan measured (`kerascale.Plan`).
    """

    bound: str
    input_batches_per_s: float
    step_batches_per_s: float
    training_batches_per_s: float
    batch_size: int
    memory_peak_bytes: int | None
    memory_limit_bytes: int | None
    recommendations: tuple[Recommendation, ...]
    plan: Any

    @property
    def memory_headroom(self) -> float | None:
        """Free share of the memory limit at the planned batch."""
        if not self.memory_peak_bytes or not self.memory_limit_bytes:
            return None
        return 1.0 - self.memory_peak_bytes / self.memory_limit_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("plan", "recommendations")
        }
        out["recommendations"] = [dataclasses.asdict(r) for r in self.recommendations]
        out["memory_headroom"] = self.memory_headroom
        out["plan"] = self.plan.to_dict()
        return out

    def __str__(self) -> str:
        b = self.batch_size
        rows = [
            f"kerascale diagnosis: training is {self.bound.upper()}-bound",
            f"  input pipeline alone  {self.input_batches_per_s:9.1f} batches/s"
            f"  ({self.input_batches_per_s * b:,.0f} samples/s)",
            f"  training step alone   {self.step_batches_per_s:9.1f} batches/s"
            f"  ({self.step_batches_per_s * b:,.0f} samples/s)",
            f"  both, as training     {self.training_batches_per_s:9.1f} batches/s"
            f"  ({self.training_batches_per_s * b:,.0f} samples/s)",
        ]
        if self.memory_peak_bytes and self.memory_limit_bytes:
            rows.append(
                f"  memory at batch {b}   {format_bytes(self.memory_peak_bytes)} of "
                f"{format_bytes(self.memory_limit_bytes)} "
                f"({self.memory_headroom:.0%} free)"
            )
        else:
            rows.append(
                "  memory                not measured (no memory limit applies)"
            )
        rows.append("What to change, most promising first:")
        rows += [f"  {i}. {r}" for i, r in enumerate(self.recommendations, 1)]
        return "\n".join(rows)


def diagnose(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    steps: int = 20,
    batch_size: int | str = "auto",
    strategy: Any = "auto",
    precision: str = "auto",
    memory_limit: int | str | None = None,
    max_batch_size: int | None = None,
    accumulation_steps: int | None = None,
    optimize_data: bool | str = "auto",
    remeasure: bool = False,
    verbose: int | str = "auto",
) -> Diagnosis:
    """Measures what bounds training of `model` on `x` here, and says what to do.

    Args:
        model, x, y: As for `kerascale.fit` (a model or builder; a dataset or
            arrays).
        steps: Timed steps per measurement, after 3 warm-up steps (>= 1).
            Defaults to 20.
        batch_size, strategy, precision, memory_limit, max_batch_size,
        accumulation_steps, optimize_data, remeasure, verbose: As for
            `kerascale.fit`: the plan they give is the one measured.

    Returns:
        A `Diagnosis`; `print()` it for the report.

    Raises:
        UnsupportedError: Off the TensorFlow backend (for now).

    Example:

    >>> print(kerascale.diagnose(model, ds))
    """
    v.positive_int("steps", steps)
    _tensorflow_only()
    options, search = validate_options(
        batch_size=batch_size,
        strategy=strategy,
        precision=precision,
        max_batch_size=max_batch_size,
        memory_limit=memory_limit,
        accumulation_steps=accumulation_steps,
        optimize_data=optimize_data,
        remeasure=remeasure,
        verbose=verbose,
    )
    if data_facts.inspect(x, y).kind == "pydataset":
        raise v.fail("x", type(x).__name__, "a tf.data.Dataset or arrays for diagnose")

    def decided(not_rebuildable: str = "") -> Any:
        return decide(
            model, x, y, options, search=search, not_rebuildable=not_rebuildable
        )

    total = WARMUP_STEPS + steps
    with Session() as session:
        session.enter(model_lib.preserved_state())
        prepared = prepare(
            session, model, x, y, decided(), copy=True, as_dataset=True,
            replan=decided,
        )  # fmt: skip
        ds, copy = prepared.x, prepared.model
        input_rate = _iterate(ds.repeat(), total)
        step_rate = _train(copy, ds.take(1).cache().repeat(), total)
        training_rate = _train(copy, ds.repeat(), total)
    peak, limit = _memory(prepared.decided)
    return _verdict(
        prepared.decided,
        input_rate=input_rate,
        step_rate=step_rate,
        training_rate=training_rate,
        peak=peak,
        limit=limit,
    )


def _tensorflow_only() -> None:
    if backend_lib.name() != "tensorflow":
        raise UnsupportedError(
            f"diagnose times a tf.data pipeline and runs on the TensorFlow backend "
            f"for now, and Keras runs on {backend_lib.name()!r} here. "
            "kerascale.callbacks.Throughput in fit's callbacks gives the step "
            "times on every backend."
        )


def _iterate(ds: tf.data.Dataset, total: int) -> float:
    it = iter(ds)
    for _ in range(WARMUP_STEPS):
        next(it)
    start = time.perf_counter()
    for _ in range(total - WARMUP_STEPS):
        next(it)
    return (total - WARMUP_STEPS) / (time.perf_counter() - start)


class _BatchClock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.ends: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def _train(model: keras.Model, ds: tf.data.Dataset, total: int) -> float:
    clock = _BatchClock()
    model.fit(
        ds, epochs=1, steps_per_epoch=total, shuffle=False, verbose=0, callbacks=[clock]
    )
    timed = clock.ends[WARMUP_STEPS - 1 :]
    return (len(timed) - 1) / (timed[-1] - timed[0])


def _memory(decided: Any) -> tuple[int | None, int | None]:
    """Peak at the planned per-replica batch, from the batch-size check's
    probes (they ran when a memory limit applies), and the limit."""
    result = decided.search
    if result is None:
        return None, None
    micro = decided.plan.micro_batch_size
    peaks = [
        p.peak_bytes
        for p in result.probes
        if p.batch == micro and p.outcome == "ok" and p.peak_bytes
    ]
    limit = getattr(result, "limit_bytes", None)
    return (max(peaks) if peaks else None), limit


def _measured_precision_gain(trials: Any, plan: Any) -> float | None:
    """mixed_bfloat16 over float32 at the planned batch, where trials timed
    both on this machine; None when they did not."""
    if trials is None:
        return None
    speed: dict[str, float] = {}
    for t in trials.trials:
        if t.batch == plan.micro_batch_size:
            speed[t.precision] = max(speed.get(t.precision, 0.0), t.samples_per_s)
    if "float32" not in speed or "mixed_bfloat16" not in speed:
        return None
    return speed["mixed_bfloat16"] / speed["float32"]


def _verdict(
    decided: Any,
    *,
    input_rate: float,
    step_rate: float,
    training_rate: float,
    peak: int | None,
    limit: int | None,
) -> Diagnosis:
    plan = decided.plan
    headroom = (1 - peak / limit) if peak and limit else None
    if plan.accumulation_steps > 1 or (
        headroom is not None and headroom < MEMORY_BOUND_HEADROOM
    ):
        bound = "memory"
        recs = _memory_advice(plan)
    elif (
        training_rate < INPUT_BOUND_SHARE * step_rate
        and input_rate < INPUT_BOUND_MAX_RATIO * step_rate
    ):
        bound = "input"
        recs = _input_advice(decided, input_rate, step_rate, training_rate)
    else:
        bound = "compute"
        recs = _compute_advice(decided, headroom)
    recs.sort(key=lambda r: -(r.expected_gain or 0.0))
    return Diagnosis(
        bound=bound,
        input_batches_per_s=input_rate,
        step_batches_per_s=step_rate,
        training_batches_per_s=training_rate,
        batch_size=plan.step_batch_size,
        memory_peak_bytes=peak,
        memory_limit_bytes=limit,
        recommendations=tuple(recs),
        plan=plan,
    )


def _input_advice(
    decided: Any, input_rate: float, step_rate: float, training_rate: float
) -> list[Recommendation]:
    data, hw = decided.data, decided.hardware
    ceiling = step_rate / training_rate
    recs = []
    if data.kind == "dataset" and not decided.optimize_data:
        recs.append(
            Recommendation(
                "kerascale.data.optimize(ds) (or optimize_data=True): parallel "
                "maps and prefetch",
                min(ceiling, max(1.0, hw.cpu.cores)),
                "the pipeline runs its maps one element at a time and does not "
                "overlap with training",
            )
        )
    if input_rate < step_rate:
        recs.append(
            Recommendation(
                "ds.cache() after the expensive, deterministic steps (decoding, "
                "resizing), before shuffle and random augmentation",
                ceiling,
                f"the pipeline alone delivers {input_rate:.1f} batches/s, the "
                f"model could take {step_rate:.1f}",
            )
        )
    else:
        recs.append(
            Recommendation(
                "ds.prefetch(tf.data.AUTOTUNE) as the last step",
                min(ceiling, (input_rate + step_rate) / max(input_rate, step_rate)),
                "the pipeline alone keeps up, but reading and training take "
                "turns instead of overlapping",
            )
        )
    if data.from_files:
        recs.append(
            Recommendation(
                "TFRecord shards read with interleave(num_parallel_calls="
                "AUTOTUNE, deterministic=False)",
                None,
                "reading many small files one after another is slow",
            )
        )
    return recs


def _compute_advice(decided: Any, headroom: float | None) -> list[Recommendation]:
    plan, hw = decided.plan, decided.hardware
    recs = []
    measured = _measured_precision_gain(decided.trials, plan)
    accelerated = hw.accelerator != "cpu" or hw.cpu.bf16
    if plan.precision == "float32" and measured is not None and measured > 1.03:
        recs.append(
            Recommendation(
                'precision="mixed_bfloat16"',
                measured,
                "timed on your data here, against float32",
            )
        )
    elif plan.precision == "float32" and measured is None and accelerated:
        recs.append(
            Recommendation(
                'precision="mixed_bfloat16" (or "auto")',
                1.4 if hw.accelerator == "cpu" else 2.0,
                "this hardware has fast 16-bit math (1.44x on the benchmark CNN "
                "on a bf16 CPU; 2-3x is usual on tensor-core GPUs)",
            )
        )
    if headroom is None or headroom > 0.3:
        recs.append(
            Recommendation(
                "a larger batch (batch_size=..., with lr_scaling)",
                None,
                "fewer, larger steps use the hardware better"
                + (f"; {headroom:.0%} of memory is free" if headroom else ""),
            )
        )
    recs.append(
        Recommendation(
            "more or faster devices (strategy='mirrored' on several GPUs)"
            if hw.accelerator != "cpu"
            else "a GPU: this model trains on a CPU",
            None,
            "the model's arithmetic is the bottleneck",
        )
    )
    recs.append(
        Recommendation(
            "a smaller model (fewer or narrower layers)",
            None,
            "less arithmetic per sample",
        )
    )
    return recs


def _memory_advice(plan: Any) -> list[Recommendation]:
    recs = []
    if plan.precision == "float32":
        recs.append(
            Recommendation(
                'precision="mixed_bfloat16"',
                None,
                "16-bit activations take half the memory: about twice the batch",
            )
        )
    recs.append(
        Recommendation(
            "gradient accumulation: keep batch_size, set max_batch_size lower "
            "(or accumulation_steps=k)",
            None,
            "the same optimizer updates from smaller micro-batches",
        )
    )
    recs.append(
        Recommendation(
            "fewer or narrower layers, or shorter inputs",
            None,
            "activations grow with depth, width and input size",
        )
    )
    return recs
