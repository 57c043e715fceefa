"""What `kerascale.diagnose` advises, from what it measured: each
`Recommendation` with its expected gain where the measurements give one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kerascale.measure.decided import Decided
    from kerascale.measure.trial_result import TrialResult
    from kerascale.measure.weighing import Weighing
    from kerascale.plan.plan import Plan

# Measures, when called, (the share of a pipeline's time its deterministic
# part takes, that part's steps), or None where it cannot be split.
Decode = Callable[[], "tuple[float, str] | None"]


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


def _measured_precision_gain(trials: TrialResult | None, plan: Plan) -> float | None:
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


def host_input_advice(
    input_rate: float, step_rate: float, training_rate: float, loader_rate: float
) -> list[Recommendation]:
    """On JAX, where Keras reads each batch in the training thread."""
    recs = []
    if loader_rate > 1.05 * training_rate or input_rate >= step_rate:
        recs.append(
            Recommendation(
                "read the input on a thread ahead of the step: kerascale.fit does "
                "(its plan's data_changes say so; optimize_data=False turns it "
                "off); in model.fit, callbacks=[kerascale.callbacks.Prefetch()]",
                loader_rate / training_rate,
                f"measured here: {training_rate:.1f} batches/s as model.fit reads "
                f"them, {loader_rate:.1f} with the reading on a thread",
            )
        )
    if input_rate < step_rate:
        recs.append(
            Recommendation(
                "less host work per batch: images as uint8 with a "
                "keras.layers.Rescaling in the model (a quarter of the bytes to "
                "gather and copy), shuffle=False for data already shuffled, a "
                "PyDataset with workers for Python-side augmentation",
                step_rate / input_rate,
                f"the input alone delivers {input_rate:.1f} batches/s, the step "
                f"could take {step_rate:.1f}: even read ahead, it is the limit",
            )
        )
    return recs


# Materializing is recommended where the deterministic part takes at least
# this share of the input pipeline's time.
MATERIALIZE_SHARE = 0.3


def input_advice(
    decided: Decided,
    input_rate: float,
    step_rate: float,
    training_rate: float,
    decode: Decode | None = None,
) -> list[Recommendation]:
    """On TensorFlow; `decode`: a function giving (the share of the
    pipeline's time its deterministic part takes, that part's steps), or
    None where `materialize` cannot split it."""
    data, hw = decided.data, decided.hardware
    ceiling = step_rate / training_rate
    recs = []
    share = decode() if decode is not None and input_rate < step_rate else None
    if share is not None and share[0] >= MATERIALIZE_SHARE:
        fraction, steps = share
        recs.append(
            Recommendation(
                "kerascale.data.materialize(ds, directory) (or fit(..., "
                "materialize=directory)): the deterministic part written once "
                "as shards, read back in parallel every epoch after",
                min(ceiling, 1 / max(1e-3, 1 - fraction)),
                f"measured here: the deterministic part ({steps}) takes "
                f"{fraction:.0%} of the pipeline's time per element, and it runs "
                "again every epoch",
            )
        )
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


def compute_advice(decided: Decided, headroom: float | None) -> list[Recommendation]:
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


def memory_advice(
    plan: Plan, recomputed: Weighing | None = None
) -> list[Recommendation]:
    """What to do on a memory-bound run; `recomputed`: the plan's weighing
    of recomputation (`measure.weighing.Weighing`), where it ran."""
    recs = [_recompute_advice(plan, recomputed)]
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


def _recompute_advice(plan: Plan, weighing: Weighing) -> Recommendation:
    """Recomputation, with the batch it buys where the plan weighed it."""
    if weighing is None:
        return Recommendation(
            "recompute=True (Keras's remat)"
            if not plan.recompute
            else "keep recompute",
            None,
            "activations recomputed in the backward pass instead of kept: a "
            "larger batch in one pass; kerascale.find_batch_size reports the "
            "bound with and without it",
        )
    speeds = {c.name: c.samples_per_s for c in weighing.candidates}
    remat = [v for k, v in speeds.items() if k.startswith("recomputation") and v]
    alone = [v for k, v in speeds.items() if not k.startswith("recomputation") and v]
    gain = remat[0] / alone[0] if remat and alone else None
    if gain is not None and gain <= 1:
        gain = None  # slower: the reason gives both speeds
    action = (
        "recomputation is on (the plan chose it)"
        if plan.recompute
        else "recompute=True (Keras's remat)"
    )
    return Recommendation(
        action,
        gain,
        f"{weighing.bound} per replica fit in one pass with it, "
        f"{weighing.bound_without} without ({weighing.ratio:.2f}x the batch); "
        f"{weighing.why}",
    )
