"""The batch that trains best per second: the gradient noise scale, the
statistical efficiency of a batch, goodput, and the learning-rate rule each
Keras optimizer gets when the batch grows. Pure.

Its design: docs/design/modules.md, `kerascale.plan.goodput`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from kerascale import _validation as v
from kerascale.plan import accumulation

# The estimates' moving average keeps this much of the past at each update
# (McCandlish et al. average |G|^2 and tr(Sigma) apart, then divide).
SMOOTHING = 0.9
# A larger batch is chosen only where its goodput beats the smaller one's by
# more than this: timings vary by a few percent run to run.
TOLERANCE = 0.03


@dataclasses.dataclass(frozen=True)
class NoiseSample:
    """One measurement of the gradient at two batch sizes, at the same
    weights (McCandlish et al. 2018, appendix A).

    Attributes:
        small: The smaller batch.
        small_sq: The mean squared norm of the gradients of batches of
            `small` (several, to lower the variance).
        big: The larger batch (the small ones together, for instance).
        big_sq: The squared norm of the gradient of a batch of `big`.
    """

    small: int
    small_sq: float
    big: int
    big_sq: float

    def __post_init__(self) -> None:
        if not 0 < self.small < self.big:
            raise ValueError(
                "A noise sample needs 0 < small < big batch. Received: "
                f"small={self.small}, big={self.big}"
            )

    @property
    def gradient_sq(self) -> float:
        """An unbiased estimate of |G|^2, the true gradient's squared norm."""
        b, s = self.big, self.small
        return (b * self.big_sq - s * self.small_sq) / (b - s)

    @property
    def trace(self) -> float:
        """An unbiased estimate of tr(Sigma), the per-sample gradients'
        total variance."""
        return (self.small_sq - self.big_sq) / (1 / self.small - 1 / self.big)


class NoiseScale:
    """The gradient noise scale B_simple = tr(Sigma) / |G|^2 of a run, from
    its samples: each estimate moves as an average of its own (they are
    noisy, and |G|^2 may come out negative from one sample), and the ratio
    is taken of the averages."""

    def __init__(self, smoothing: float = SMOOTHING):
        self.smoothing = v.fraction_below_one("smoothing", smoothing)
        self.samples = 0
        self._gradient_sq = 0.0
        self._trace = 0.0

    def add(self, sample: NoiseSample) -> None:
        """Moves the averages by `sample`; a sample that is not finite (a
        gradient that overflowed) is left out."""
        if not (math.isfinite(sample.small_sq) and math.isfinite(sample.big_sq)):
            return
        keep = self.smoothing if self.samples else 0.0
        self._gradient_sq = keep * self._gradient_sq + (1 - keep) * sample.gradient_sq
        self._trace = keep * self._trace + (1 - keep) * sample.trace
        self.samples += 1

    def state(self) -> list[float]:
        """The averages, as a checkpoint keeps them (`restore`)."""
        return [self.samples, self._gradient_sq, self._trace]

    def restore(self, state: list[float]) -> None:
        samples, self._gradient_sq, self._trace = state
        self.samples = int(samples)

    @property
    def value(self) -> float | None:
        """B_simple in samples; None before a sample, or while the gradient's
        estimate is not positive (the noise swamps it: no batch is known to
        pay)."""
        if not self.samples or self._gradient_sq <= 0:
            return None
        return max(self._trace, 0.0) / self._gradient_sq


def efficiency(batch: int, base: int, noise: float) -> float:
    """The samples a batch of `base` needs to reach a loss, over what a batch
    of `batch` needs, at noise scale `noise`: (noise + base) / (noise + batch)
    (from McCandlish et al.'s E = E_min (1 + B / B_noise); Pollux's statistical
    efficiency). 1 at `base`, below 1 for a larger batch."""
    return (noise + base) / (noise + batch)


def goodput(samples_per_second: float, batch: int, base: int, noise: float) -> float:
    """Samples per second as progress at batch `base` counts them."""
    return samples_per_second * efficiency(batch, base, noise)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The batch with the best goodput among the timed ones.

    Attributes:
        batch: The chosen batch.
        base: The batch progress is counted at (the user's or Keras's).
        noise: The noise scale it was chosen at.
        goodput: Per timed batch, its goodput (samples/s at `base`).
        gain: The chosen batch's goodput over `base`'s (1 where it is `base`).
    """

    batch: int
    base: int
    noise: float
    goodput: Mapping[int, float]
    gain: float


def choose(
    speeds: Mapping[int, float],
    base: int,
    noise: float,
    tolerance: float = TOLERANCE,
) -> Choice:
    """The batch of `speeds` (samples/s, per batch) that trains fastest to a
    loss at noise scale `noise`: the best goodput, where a larger batch must
    beat every smaller one's by more than `tolerance` (a timing's spread).
    Goodput is counted at `base`; where `speeds` does not time it (a run
    that left it), the smallest batch timed stands first."""
    if not speeds:
        raise ValueError("speeds must time at least one batch. Received none")
    if noise < 0 or not math.isfinite(noise):
        raise ValueError(f"noise must be a finite number >= 0. Received: {noise}")
    rates = {b: goodput(s, b, base, noise) for b, s in sorted(speeds.items())}
    first = base if base in rates else min(rates)
    best = first
    for b, rate in rates.items():
        if b > best and rate > rates[best] * (1 + tolerance):
            best = b
    return Choice(best, base, noise, rates, rates[best] / rates[first])


# --- The learning rate when the batch grows -----------------------------------


@dataclasses.dataclass(frozen=True)
class LearningRateRule:
    """How an optimizer's learning rate follows the batch.

    Attributes:
        scaling: "linear" (B/base: SGD's, Goyal et al. 2017) or "sqrt"
            (sqrt(B/base): adaptive optimizers', Malladi et al. 2022).
        warmup: Whether the scaled rate is reached over a warmup (the linear
            rule's, from the base rate).
        why: The family, in words.
    """

    scaling: str
    warmup: bool
    why: str

    def factor(self, batch: int, base: int) -> float:
        """The rate's factor at `batch` (fit's `lr_scaling` formula)."""
        return accumulation.lr_factor(self.scaling, batch, base)


LINEAR = LearningRateRule("linear", True, "SGD family: linear scaling, warmup")
SQRT = LearningRateRule("sqrt", False, "adaptive (Adam family): square-root scaling")

# Keras's optimizers by class name. Those absent keep their batch: no rule
# is known for them (Lion's sign update and Muon's orthogonalised one are
# not covered by either anchor; MultiOptimizer mixes rules; ScheduleFreeAdamW
# keeps its own averaging schedule).
RULES: Mapping[str, LearningRateRule] = {
    "SGD": LINEAR,
    "Adam": SQRT,
    "AdamW": SQRT,
    "Adamax": SQRT,
    "Nadam": SQRT,
    "RMSprop": SQRT,
    "Adagrad": SQRT,
    "Adadelta": SQRT,
    "Adafactor": SQRT,
    "Lamb": SQRT,
    "Ftrl": SQRT,
}
NO_RULE = ("Lion", "Muon", "MultiOptimizer", "ScheduleFreeAdamW")


def rule_for(optimizer_class_names: tuple[str, ...]) -> LearningRateRule | None:
    """The rule for an optimizer, by the names of its class and its bases
    (most derived first, as `type(o).__mro__` gives them): a subclass of
    Adam takes Adam's. None where none is known (the batch is kept)."""
    for name in optimizer_class_names:
        if name in NO_RULE:
            return None
        if name in RULES:
            return RULES[name]
    return None


def rule_of(optimizer: object) -> LearningRateRule | None:
    """`rule_for` a Keras optimizer (a `LossScaleOptimizer`'s inner one)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        optimizer = inner
    return rule_for(tuple(c.__name__ for c in type(optimizer).__mro__))


# --- Growing the batch inside the run -------------------------------------------

# An epoch keeps at least this many updates, however large the noise scale.
MIN_UPDATES = 16


@dataclasses.dataclass(frozen=True)
class Growth:
    """The batch for the rest of a run, from what the run has measured.

    Attributes:
        batch: The batch to train at next (the current one: no change).
        noise: The noise scale it was chosen at.
        speeds: Samples/s per batch: measured, and for the next doubling
            predicted (`predicted`).
        predicted: The batch predicted that was chosen, else the next
            doubling's (its speed a prediction), or None.
        gain: The chosen batch's goodput over the current one's.
        why: Why the batch stays, where it does ("" where it changes).
    """

    batch: int
    noise: float
    speeds: Mapping[int, float]
    predicted: int | None
    gain: float
    why: str = ""


def grow(
    current: int,
    base: int,
    noise: float | None,
    step_seconds: Mapping[int, float],
    *,
    ceiling: int,
    remaining_samples: int,
    switch_seconds: float,
    compute_seconds: float | None = None,
    tolerance: float = TOLERANCE,
    doublings: int = 1,
) -> Growth:
    """The batch that trains fastest to a loss for the rest of a run: the
    best goodput among the batches the run has timed and the next
    `doublings` doublings of `current`, whose speeds are predicted from the
    timed ones (a line through the last two; where one is timed, its step
    plus the forward and backward passes of the samples added, or
    `DOUBLING_PRIOR` a doubling without those: the run then times it, and
    goes back if it was wrong).

    A batch not yet run pays only where the time it saves over
    `remaining_samples` outweighs `switch_seconds` (compiling the step for
    the new shape); one already run costs nothing to go back to.

    Args:
        current: The batch training now (timed).
        base: The batch goodput is counted at (the user's or Keras's; timed).
        noise: The gradient noise scale, or None while unknown.
        step_seconds: The steady time of one step, per batch run so far.
        ceiling: The largest batch allowed (memory, and `MIN_UPDATES`).
        remaining_samples: Samples the run has left to train.
        switch_seconds: What moving to a new batch costs.
        compute_seconds: What `base` more samples add to a step's forward
            and backward passes, where measured (two noise samples'
            micro-batches, at the base and at twice it).
        tolerance: How much better a larger batch must be.
        doublings: How many doublings of `current` one change may reach
            (one compile for a larger step, where the learning-rate rule
            allows it: the square root's rises 2.8x at three).
    """
    if current not in step_seconds:
        raise ValueError(
            f"step_seconds must time the current batch {current}. Received "
            f"batches {sorted(step_seconds)}"
        )
    speeds = {b: b / t for b, t in step_seconds.items() if b <= ceiling}
    speeds[current] = current / step_seconds[current]
    if noise is None:
        return Growth(current, math.nan, speeds, None, 1.0, "no noise scale yet")
    candidates = [current * 2**k for k in range(1, doublings + 1)]
    candidates = [b for b in candidates if b <= ceiling and b not in step_seconds]
    for batch in candidates:
        step = predicted_step(step_seconds, batch, base, compute_seconds)
        speeds[batch] = batch / step
    choice = choose(speeds, base, noise, tolerance)
    # The prediction the choice rests on, else the next doubling's.
    predicted = choice.batch if choice.batch in candidates else None
    predicted = predicted or (candidates[0] if candidates else None)
    rates = choice.goodput
    gain = rates[choice.batch] / rates[current]
    if choice.batch == current:
        return Growth(current, noise, speeds, predicted, 1.0, "goodput is best here")
    if choice.batch == predicted:
        # The time the rest of the run takes at each, for the same progress.
        progress = remaining_samples * efficiency(current, base, noise)
        saved = progress / rates[current] - progress / rates[predicted]
        if saved <= switch_seconds:
            return Growth(
                current,
                noise,
                speeds,
                predicted,
                1.0,
                f"{predicted} would save {saved:.2g}s, less than the "
                f"{switch_seconds:.2g}s a new step shape costs",
            )
    return Growth(choice.batch, noise, speeds, predicted, gain)


# A step's time at twice a batch, over the batch's, before the run has timed
# two batches: between "the same" (a step all overhead) and "twice" (all
# compute). Measured on this 2-core CPU, 32 to 512: 1.0-1.5 on TensorFlow,
# 1.1-1.9 on JAX (an MLP, benchmarks/time_to_accuracy.py).
DOUBLING_PRIOR = math.sqrt(2)


def predicted_step(
    step_seconds: Mapping[int, float],
    batch: int,
    base: int,
    compute_seconds: float | None,
) -> float:
    """A step's time at `batch` from the timed ones: on the line through
    the two largest (never faster than the largest's); with one, its time
    plus the passes of the samples added (`compute_seconds` a `base`), or
    grown by `DOUBLING_PRIOR` per doubling where those are not measured."""
    timed = sorted(step_seconds)
    top = timed[-1]
    if len(timed) < 2:
        if compute_seconds is not None:
            return step_seconds[top] + compute_seconds * (batch - top) / base
        return step_seconds[top] * DOUBLING_PRIOR ** math.log2(batch / top)
    low = timed[-2]
    slope = max(0.0, (step_seconds[top] - step_seconds[low]) / (top - low))
    return step_seconds[top] + slope * (batch - top)
