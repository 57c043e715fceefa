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
    `speeds` must time `base` itself: goodput is counted against it."""
    if base not in speeds:
        raise ValueError(
            f"speeds must time the base batch {base}. Received batches {sorted(speeds)}"
        )
    if noise < 0 or not math.isfinite(noise):
        raise ValueError(f"noise must be a finite number >= 0. Received: {noise}")
    rates = {b: goodput(s, b, base, noise) for b, s in sorted(speeds.items())}
    best = base
    for b, rate in rates.items():
        if b > best and rate > rates[best] * (1 + tolerance):
            best = b
    return Choice(best, base, noise, rates, rates[best] / rates[base])


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
        ratio = batch / base
        return ratio if self.scaling == "linear" else math.sqrt(ratio)


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
