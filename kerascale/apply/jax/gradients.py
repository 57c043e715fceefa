"""The gradients of micro-batches on JAX, through the trainer's own
stateless loss (`compute_loss_and_updates`, what Keras's JAX train step
differentiates): no variable is assigned.

Its design: docs/design/modules.md, `kerascale.apply.gradient_noise`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

# One compiled gradient per model: a run samples the noise scale again and again.
_COMPILED: weakref.WeakKeyDictionary[Any, Callable[..., Any]] = (
    weakref.WeakKeyDictionary()
)


def gradients(
    model: Any, parts: Iterable[tuple[Any, Any, Any]]
) -> Iterator[np.ndarray]:
    """Each part's gradient (x, y, sample_weight), flattened into one float32
    vector, one at a time, at the model's weights; the model is left as it
    was."""
    state = [
        [v.value for v in variables]
        for variables in (
            model.trainable_variables,
            model.non_trainable_variables,
            model.metrics_variables,
            model.optimizer.variables,
        )
    ]
    gradient = _COMPILED.get(model)
    if gradient is None:
        gradient = _COMPILED[model] = _compiled(weakref.ref(model))
    for part in parts:
        yield np.asarray(gradient(*state, *part))


def _compiled(ref: weakref.ref) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def gradient(trainable, non_trainable, metrics, optimizer, x, y, sample_weight):
        def loss(trainable):
            value, _ = ref().compute_loss_and_updates(
                trainable, non_trainable, metrics, x, y, sample_weight,
                training=True, optimizer_variables=optimizer,
            )  # fmt: skip
            return value

        grads = jax.grad(loss)(trainable)
        return jnp.concatenate([jnp.ravel(g).astype(jnp.float32) for g in grads])

    return gradient
