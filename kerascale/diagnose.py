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
import math
from typing import TYPE_CHECKING, Any, cast

from kerascale import _validation as v
from kerascale._display import Table
from kerascale._units import format_bytes
from kerascale.apply import materialize
from kerascale.apply import model as model_lib
from kerascale.apply.session import Session, prepare
from kerascale.errors import UnsupportedError
from kerascale.measure import advice, engines
from kerascale.measure.advice import Decode, Recommendation
from kerascale.measure.decide import decide, validate_options
from kerascale.measure.stages import Call
from kerascale.plan import fallback
from kerascale.sense import backend as backend_lib
from kerascale.sense import data_facts

if TYPE_CHECKING:
    from kerascale.apply.session import Prepared
    from kerascale.measure.decided import Decided
    from kerascale.plan.plan import Plan

MEMORY_BOUND_HEADROOM = 0.10  # less free memory than this at the planned batch
INPUT_BOUND_SHARE = 0.85  # training slower than this share of the step alone
# ...and an input pipeline not this much faster than the step: even read in
# turn with the step (no prefetch), a pipeline 5x faster takes at most 1/6 of
# the time, so a slower training rate is noise, not input.
INPUT_BOUND_MAX_RATIO = 5.0


@dataclasses.dataclass(frozen=True)
class Diagnosis(Table):
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
        loader_batches_per_s: On JAX, training with the host loader
            (`kerascale.callbacks.Prefetch`) as `kerascale.fit` runs it;
            `training_batches_per_s` is then plain `model.fit`'s.
    """

    bound: str
    input_batches_per_s: float
    step_batches_per_s: float
    training_batches_per_s: float
    batch_size: int
    memory_peak_bytes: int | None
    memory_limit_bytes: int | None
    recommendations: tuple[Recommendation, ...]
    plan: Plan
    loader_batches_per_s: float | None = None

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

    def why(self) -> str:
        """The verdict's reason, in one line."""
        if self.bound == "memory":
            if self.plan.accumulation_steps > 1:
                return (
                    f"the batch needs {self.plan.accumulation_steps} accumulated "
                    "steps to fit"
                )
            return f"only {self.memory_headroom:.0%} of the memory is left free"
        if not self.step_batches_per_s:
            return "no training step was timed"
        share = self.training_batches_per_s / self.step_batches_per_s
        if self.bound == "input":
            why = (
                "the input alone is slower than the step"
                if self.input_batches_per_s < self.step_batches_per_s
                else "the input alone keeps up, but beside the step it does not "
                "(they share the cores)"
            )
            return f"training runs at {share:.0%} of the step's own speed; {why}"
        return f"training runs at {share:.0%} of the step's own speed"

    def __str__(self) -> str:
        b = self.batch_size
        p = self.plan
        measured = f"batch {b}, {p.precision}"
        if p.replicas > 1:
            measured += f", {p.replicas} replicas"
        rows = [
            f"kerascale diagnosis ({measured}): training is "
            f"{self.bound.upper()}-bound: {self.why()}",
            f"  input pipeline alone  {self.input_batches_per_s:9.1f} batches/s"
            f"  ({self.input_batches_per_s * b:,.0f} samples/s)",
            f"  training step alone   {self.step_batches_per_s:9.1f} batches/s"
            f"  ({self.step_batches_per_s * b:,.0f} samples/s)",
            f"  both, as training     {self.training_batches_per_s:9.1f} batches/s"
            f"  ({self.training_batches_per_s * b:,.0f} samples/s)",
        ]
        if self.loader_batches_per_s is not None:
            rows[-1] = rows[-1].replace("as training    ", "as model.fit   ")
            rows.append(
                f"  with kerascale's loader {self.loader_batches_per_s:7.1f} "
                f"batches/s  ({self.loader_batches_per_s * b:,.0f} samples/s)"
            )
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
    recompute: bool | str = "auto",
    remeasure: bool = False,
    verbose: int | str = "auto",
) -> Diagnosis:
    """Measures what bounds training of `model` on `x` here, and says what to do.

    Args:
        model, x, y: As for `kerascale.fit` (a model or builder; a dataset or
            arrays).
        steps: Timed steps per measurement, after 3 warm-up steps (>= 1).
            Defaults to 20.
        batch_size, strategy, precision, memory_limit: As for
            `kerascale.fit`: the plan they give is the one measured (and the
            same for the arguments below).
        max_batch_size, accumulation_steps, optimize_data: As for
            `kerascale.fit`.
        recompute, remeasure, verbose: As for `kerascale.fit`.

    Returns:
        A `Diagnosis`; `print()` it for the report.

    On JAX (arrays or a `PyDataset`), training is also timed with the host
    loader `kerascale.fit` installs (`Prefetch`), which times the input.

    Raises:
        UnsupportedError: On a backend other than TensorFlow and JAX.

    Example:

    >>> print(kerascale.diagnose(model, ds))
    """
    v.positive_int("steps", steps)
    backend = backend_lib.name()
    _supported(backend)
    options, search = validate_options(
        batch_size=batch_size,
        strategy=strategy,
        precision=precision,
        max_batch_size=max_batch_size,
        memory_limit=memory_limit,
        accumulation_steps=accumulation_steps,
        optimize_data=optimize_data,
        recompute=recompute,
        remeasure=remeasure,
        verbose=verbose,
    )
    timing = engines.timing(backend)
    # A dataset that repeats forever is read for the steps diagnose times.
    read = steps + timing.WARMUP_STEPS if _endless(x) else None
    _readable(timing, x, y, read)

    def measured(attempt: fallback.Attempt) -> tuple[Prepared, Any]:
        """One attempt of the ladder: its decision, applied to a copy, and
        the rates timed on it."""
        call = Call(steps_per_epoch=read, attempt=attempt)
        decided = decide(model, x, y, attempt.options, call=call, search=search)
        with Session() as session:
            session.enter(model_lib.preserved_state())
            prepared = prepare(
                session,
                model,
                x,
                y,
                decided,
                copy=True,
                as_dataset=timing.AS_DATASET,
                read_in_part=True,
            )
            return prepared, timing.rates(prepared, steps)

    prepared, rates = fallback.attempted(measured, options)
    loader_rate = None if math.isnan(rates.loaded) else rates.loaded
    applied = cast("Decided", prepared.decided)  # what `decide` gave it
    peak, limit = _memory(applied)
    return _verdict(
        applied,
        decode=_decode(x, prepared, rates.input),
        input_rate=rates.input,
        step_rate=rates.step,
        training_rate=rates.plain,
        peak=peak,
        limit=limit,
        loader_rate=loader_rate,
    )


def _decode(x: Any, prepared: Prepared, batches_per_s: float) -> Decode | None:
    """For a `tf.data` input: measures, when called (an input-bound verdict
    only), the share of the input's time its deterministic part takes."""
    if not data_facts.is_dataset(x):
        return None
    per_s = batches_per_s * prepared.decided.plan.step_batch_size
    return lambda: materialize.decode_share(x, per_s)


def _readable(timing: Any, x: Any, y: Any, steps: int | None) -> None:
    """Refuses, naming `x`, an input diagnose cannot read several times."""
    kind = data_facts.inspect(x, y, steps_per_epoch=steps).kind
    if kind not in timing.READABLE and not data_facts.indexable_grain(x):
        raise v.fail("x", type(x).__name__, timing.READABLE_HINT)


def _endless(x: Any) -> bool:
    """Whether `x` is a `tf.data` pipeline that repeats forever."""
    if not data_facts.is_dataset(x):
        return False
    from kerascale._tf import tf

    return int(x.cardinality()) == tf.data.INFINITE_CARDINALITY


def _supported(backend: str) -> None:
    if not backend_lib.supported(backend):
        raise UnsupportedError(
            f"diagnose runs on the TensorFlow and JAX backends, and Keras runs "
            f"on {backend!r} here. kerascale.callbacks.Throughput in fit's "
            "callbacks gives the step times on every backend."
        )


def _memory(decided: Decided) -> tuple[int | None, int | None]:
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


def _verdict(
    decided: Decided,
    *,
    input_rate: float,
    step_rate: float,
    training_rate: float,
    peak: int | None,
    limit: int | None,
    loader_rate: float | None = None,
    decode: Decode | None = None,
) -> Diagnosis:
    plan = decided.plan
    headroom = (1 - peak / limit) if peak and limit else None
    if plan.accumulation_steps > 1 or (
        headroom is not None and headroom < MEMORY_BOUND_HEADROOM
    ):
        bound = "memory"
        recs = advice.memory_advice(plan, decided.recomputed)
    elif (
        training_rate < INPUT_BOUND_SHARE * step_rate
        and input_rate < INPUT_BOUND_MAX_RATIO * step_rate
    ):
        bound = "input"
        if loader_rate is None:
            recs = advice.input_advice(
                decided, input_rate, step_rate, training_rate, decode
            )
        else:
            recs = advice.host_input_advice(
                input_rate, step_rate, training_rate, loader_rate
            )
    else:
        bound = "compute"
        recs = advice.compute_advice(decided, headroom)
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
        loader_batches_per_s=loader_rate,
    )
