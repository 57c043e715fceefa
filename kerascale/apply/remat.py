"""Recomputation (rematerialization) set in place on the model that trains:
Keras's own remat (`keras.RematScope`'s "activations" mode; `tf.recompute_grad`
on TensorFlow, `jax.checkpoint` on JAX), switched on for the model's layers
without copying the model, and switched back off when the run ends.

Its design: docs/design/modules.md, `kerascale.apply.remat`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerascale import _keras_compat as keras_compat

MODES = ("activations",)


def layers_for(model: Any) -> list[Any]:
    """The layers recomputation is set on: every layer but the model itself
    (a layer without an activation is left as it is by Keras)."""
    return [layer for layer in keras_compat.all_layers(model) if layer is not model]


def apply(model: Any, mode: str = "activations") -> Callable[[], None]:
    """Switches recomputation `mode` on for `model`'s layers (`layers_for`),
    in place; returns the undo. Keras's traced train function is dropped both
    ways: it was traced with the other setting."""
    if mode not in MODES:
        raise ValueError(f"recomputation mode {mode!r}: one of {MODES}")
    undo_layers = keras_compat.set_remat(layers_for(model), mode)
    model.train_function = None

    def undo() -> None:
        undo_layers()
        model.train_function = None

    return undo
