"""`NoiseScale`: the gradient noise scale of a run, at its epochs' ends."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascale import _validation as v
from kerascale.apply import gradient_noise
from kerascale.callbacks._base import KerascaleCallback
from kerascale.errors import ConfigurationError
from kerascale.plan import goodput


class NoiseScale(KerascaleCallback):
    """Measures the gradient noise scale at the end of each epoch: the batch
    beyond which a larger batch stops buying proportionally fewer updates
    (B_simple of McCandlish et al., "An Empirical Model of Large-Batch
    Training", 2018). Where it is well above your batch, a larger batch with
    a scaled learning rate would reach the same loss in fewer updates; where
    it is below, your batch is already past the point of diminishing returns.
    It grows as the loss falls.

    Each measurement takes the gradients of `parts` micro-batches of `small`
    samples of `x` (consecutive samples, from a place that moves on each
    time: no random state is used) at the model's weights, which costs one
    step's forward and backward passes at `small * parts` samples without
    an update; the estimates of |G|^2 and tr(Sigma) are averaged over the
    measurements (`smoothing`), then divided. Nothing it does changes
    training: the same seed trains the same weights with or without it.

    The figure is kept per epoch in `epochs_seen`, and, with `in_logs`, put
    in the epoch's logs as `noise_scale` (so `History` has it).

    Args:
        x: Input arrays (a NumPy array, or a list or dict of them) to
            measure on: your training data or a sample of it.
        y: Target arrays. Defaults to `None` (a model whose loss needs none).
        sample_weight: Per-sample weights. Defaults to `None`.
        small: Samples of each micro-batch: the batch the figure is
            measured at. Defaults to 32 (Keras's batch).
        parts: Micro-batches per measurement (at least 2). Defaults to 8.
        every: Measure every `every` epochs. Defaults to 1.
        smoothing: How much of the past the averages keep at each
            measurement, in [0, 1). Defaults to 0.9.
        in_logs: Put the figure in the epoch's logs. Defaults to `True`.

    Example:

    >>> noise = kerascale.callbacks.NoiseScale(x_train, y_train)
    >>> history = model.fit(x_train, y_train, epochs=5, callbacks=[noise])
    >>> history.history["noise_scale"]
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        small: int = 32,
        parts: int = 8,
        every: int = 1,
        smoothing: float = goodput.SMOOTHING,
        in_logs: bool = True,
    ):
        super().__init__()
        v.positive_int("small", small)
        v.positive_int("every", every)
        v.int_at_least("parts", parts, 2)
        v.fraction_below_one("smoothing", smoothing)
        v.boolean("in_logs", in_logs)
        self.samples = _samples(x, y, sample_weight)
        if self.samples < small * parts:
            raise ConfigurationError(
                f"x must hold at least small * parts = {small * parts} samples. "
                f"Received: {self.samples}. Pass more samples, or a smaller "
                "small or parts."
            )
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.small, self.parts, self.every = small, parts, every
        self.smoothing, self.in_logs = smoothing, in_logs
        self.epochs_seen: list[dict[str, float | int | None]] = []
        self._scale = goodput.NoiseScale(smoothing)
        self._taken = 0

    def on_train_begin(self, logs=None):
        self.start_run()
        self.epochs_seen = []
        self._scale = goodput.NoiseScale(self.smoothing)
        self._taken = 0

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        span = self.small * self.parts
        start = (self._taken * span) % (self.samples - span + 1)
        self._taken += 1
        sample = gradient_noise.sample(
            self.model,
            self.x,
            self.y,
            self.sample_weight,
            small=self.small,
            parts=self.parts,
            start=start,
        )
        self._scale.add(sample)
        value = self._scale.value
        self.epochs_seen.append(
            {
                "epoch": epoch,
                "noise_scale": value,
                "gradient_sq": sample.gradient_sq,
                "trace": sample.trace,
            }
        )
        if self.in_logs and logs is not None and value is not None:
            logs["noise_scale"] = value

    @property
    def value(self) -> float | None:
        """The latest noise scale (samples); None before a measurement, or
        while the gradient's estimate is swamped by its noise."""
        return self._scale.value


def _samples(x: Any, y: Any, sample_weight: Any) -> int:
    """The samples of arrays `x`, which `y` and `sample_weight` must match.

    Raises:
        ConfigurationError: Naming the argument that is not arrays or does
            not match.
    """
    counts = {}
    for name, data in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        if data is None and name != "x":
            continue
        leaves = [] if data is None else keras.tree.flatten(data)
        if not leaves or not all(np.ndim(a) >= 1 for a in leaves):
            raise v.fail(
                name,
                type(data).__name__,
                "arrays (NumPy, or a list or dict of them) with a batch axis",
            )
        lengths = sorted({int(np.shape(a)[0]) for a in leaves})
        if len(lengths) != 1:
            raise ConfigurationError(
                f"{name}'s arrays must have one length. Received lengths {lengths}."
            )
        counts[name] = lengths[0]
        if counts[name] != counts["x"]:
            raise ConfigurationError(
                f"{name} must have as many samples as x ({counts['x']}). "
                f"Received: {counts[name]} samples."
            )
    return counts["x"]
