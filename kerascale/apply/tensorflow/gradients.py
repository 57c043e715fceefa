"""The gradients of micro-batches on TensorFlow, as Keras's TensorFlow train
step computes them (a `GradientTape` over the forward pass and
`compute_loss`), with every variable the pass moves put back after.

Its design: docs/design/modules.md, `kerascale.apply.gradient_noise`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

# One traced gradient per model: a run samples the noise scale again and again.
_TRACED: weakref.WeakKeyDictionary[Any, Callable[..., Any]] = (
    weakref.WeakKeyDictionary()
)


def gradients(
    model: Any, parts: Iterable[tuple[Any, Any, Any]]
) -> Iterator[np.ndarray]:
    """Each part's gradient (x, y, sample_weight), flattened into one float32
    vector, one at a time. Once the generator ends (or is closed), the
    model's variables and its metrics' state (batch statistics, a dropout's
    seed, the loss tracker) are as they were."""
    kept = [*model.variables, *model.metrics_variables]
    values = [v.numpy() for v in kept]
    gradient = _TRACED.get(model)
    if gradient is None:
        gradient = _TRACED[model] = _traced(weakref.ref(model))
    try:
        for part in parts:
            yield gradient(*part).numpy()
    finally:
        for variable, value in zip(kept, values, strict=True):
            variable.assign(value)


def _traced(ref: weakref.ref) -> Callable[..., Any]:
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def gradient(x, y, sample_weight):
        model = ref()
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            # As Keras's step does: float16 gradients need the loss scaled (a
            # constant factor leaves the noise scale, a ratio, as it is).
            loss = model.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.concat(
            [
                tf.reshape(tf.cast(tf.convert_to_tensor(g), tf.float32), [-1])
                for g in grads
                if g is not None
            ],
            axis=0,
        )

    return gradient
