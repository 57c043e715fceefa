"""The gradient noise scale of a model on its data, at its weights: the
gradients of `parts` micro-batches of `small` samples, whose mean is the
gradient of their union (McCandlish et al. 2018, appendix A).

Its design: docs/design/modules.md, `kerascale.apply.gradient_noise`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import keras
import numpy as np

from kerascale import _validation as v
from kerascale.apply import strategy
from kerascale.plan.goodput import NoiseSample
from kerascale.sense import backend as backend_lib


def sample(
    model: Any,
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    small: int,
    parts: int = 8,
    start: int = 0,
    seconds: list[float] | None = None,
) -> NoiseSample:
    """One `NoiseSample` of a compiled `model` on arrays: the gradients of
    `parts` consecutive micro-batches of `small` samples from `start`, in
    training mode, with the model's loss (a mean over the batch, as Keras's
    losses reduce by default). It costs one training step's forward and
    backward passes at `small * parts` (no update), and leaves the model,
    its optimizer and every random state as they were. `seconds`, where
    given, gets each micro-batch's time (its gradient computed and fetched;
    the first compiles where nothing has yet)."""
    v.int_at_least("small", small, 1)
    v.int_at_least("parts", parts, 2)
    if not model.trainable_variables:
        raise ValueError(
            "A noise sample needs trainable weights; the model has none. "
            "Build the model and leave some weights trainable."
        )
    n = len(keras.tree.flatten(x)[0])
    if start < 0 or start + small * parts > n:
        raise ValueError(
            f"A noise sample of {parts} x {small} samples from {start} needs "
            f"{start + small * parts} samples; x has {n}. Pass a smaller small "
            "or parts."
        )

    def cut(data: Any, j: int) -> Any:
        if data is None:
            return None
        begin = start + j * small
        return keras.tree.map_structure(lambda a: a[begin : begin + small], data)

    chunks = ((cut(x, j), cut(y, j), cut(sample_weight, j)) for j in range(parts))
    gradients = strategy.gradients_of(backend_lib.name())
    total: np.ndarray | None = None
    squares = []
    with contextlib.closing(gradients(model, chunks)) as each:
        began = time.perf_counter()
        for g in each:
            g = g.astype(np.float64)
            if seconds is not None:
                now = time.perf_counter()
                seconds.append(now - began)
                began = now
            squares.append(float(g @ g))
            total = g if total is None else total + g
    mean = total / parts
    big_sq = float(mean @ mean)
    return NoiseSample(small, float(np.mean(squares)), small * parts, big_sq)
