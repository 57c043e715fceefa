"""Section 4 of `kerascale._keras_compat` (see its docstring): a model
built before a `keras.distribution` was set, on JAX. Keras's JAX variables
take their layout when created under a distribution (`Variable._layout`,
read by `Variable._direct_assign`), and Keras has no public way to lay out
an existing one; `tests_jax/test_compat_jax.py` fails when that changes.

An optimizer slot takes its variable's layout only when it is created
(`add_variable_from_reference` copies `_layout`, keras-team/keras#21264);
one built before the distribution was set has a path of its own that a
`LayoutMap` does not name (`adam/wide_kernel_momentum`), so `lay_out` gives
it its variable's layout, found by the name Keras builds for it (the
variable's path with "/" made "_", then "_" and the slot's name) and its
shape: a slot of a split variable is split alike (ZeRO)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerascale._state import host_local


def model_variables(model: Any) -> list[Any]:
    """Every variable Keras's JAX trainer carries through a step: the
    model's, its optimizer's and its metrics', each once."""
    optimizer = getattr(model, "optimizer", None)
    found = [
        *model.trainable_variables,
        *model.non_trainable_variables,
        *(getattr(optimizer, "variables", None) or []),
        *getattr(model, "metrics_variables", []),
        *_compiled_metric_variables(model),
    ]
    return list({id(v): v for v in found}.values())


def _compiled_metric_variables(model: Any) -> list[Any]:
    """The variables of the metric objects `compile` received, which Keras
    lists among the model's only once its first step built the compiled
    metrics (`_compile_config`): a metric made (and its state set) before
    the run must be laid out with the rest."""
    import keras

    config = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    found = []
    for name in ("metrics", "weighted_metrics"):
        for obj in keras.tree.flatten(config.get(name)):
            if isinstance(obj, keras.metrics.Metric):
                found.extend(obj.variables)
    return found


def train_state(model: Any) -> tuple[list[Any], ...]:
    """The values Keras's JAX `train_step` takes as its state, in its order:
    trainable, non-trainable, optimizer and metrics variables (a built
    model and optimizer)."""
    optimizer = model.optimizer
    return (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
        [v.value for v in model.metrics_variables],
    )


def lay_out(model: Any, distribution: Any) -> Callable[[], None]:
    """Gives the model's variables that have no layout the one
    `distribution` gives a new variable, with their values placed so (JAX
    backend; see 4. above). Returns the undo: every variable of the model
    that had no layout before, those the run created too (its optimizer's),
    goes back to no layout, on the device it was on (the first local device
    for a new one), keeping its value; the functions Keras traced before
    the run are put back."""
    import jax

    before = {id(v) for v in model_variables(model) if v._layout is not None}
    # Functions Keras traced earlier carry the earlier placement: traced anew.
    traced = {name: getattr(model, name, None) for name in _JAX_TRACED}
    for name in _JAX_TRACED:
        setattr(model, name, None)
    placed = {}
    layout_of = _layouts_by_reference(model, distribution)

    def undo() -> None:
        home = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        for v in model_variables(model):
            if id(v) in before or v._layout is None:
                continue
            v._layout = None
            local = host_local(v.value)  # off every other process's devices
            v._value = jax.device_put(local, placed.get(id(v), home))
        for name, fn in traced.items():
            setattr(model, name, fn)

    try:
        for v in model_variables(model):
            if id(v) in before:
                continue
            placed[id(v)] = v.value.sharding
            v._layout = layout_of(v)
            v._direct_assign(v.value)
    except BaseException:
        undo()  # nothing half laid out
        raise
    return undo


def _layouts_by_reference(model: Any, distribution: Any) -> Callable[[Any], Any]:
    """A variable's layout: an optimizer slot's is its variable's (the
    longest variable path its name starts with, of its shape)."""
    optimizer = getattr(model, "optimizer", None)
    slots = {id(v) for v in getattr(optimizer, "variables", None) or []}
    references = sorted(
        ((r.path.replace("/", "_") + "_", r) for r in model.trainable_variables),
        key=lambda pair: -len(pair[0]),
    )

    def layout_of(v: Any) -> Any:
        if id(v) in slots:
            for prefix, reference in references:
                same = tuple(v.shape) == tuple(reference.shape)
                if same and v.name.startswith(prefix):
                    return distribution.get_variable_layout(reference)
        return distribution.get_variable_layout(v)

    return layout_of


_JAX_TRACED = ("train_function", "test_function", "predict_function")


class StateGuard:
    """Puts a model's variables back after Keras's JAX `fit` raised in its
    first step.

    Keras's JAX `fit` takes every variable's value into the step's state at
    an epoch's first step and empties the variable (`_value = None`,
    `_purge_model_variables`); its `finally` puts back the state of the last
    step that completed (`jax_state_sync` from `_jax_state`). When the very
    first step raises there is none, and the model is left with empty
    variables: any later use fails with "'NoneType' object is not callable"
    (Keras 3.15). `before_first_step` keeps references to the values (no
    copy); `recover` puts them back where the failed step did not consume
    them (a step that ran donates its inputs)."""

    def __init__(self, model: Any):
        self.model = model
        self._kept: list[tuple[Any, Any]] = []

    def before_first_step(self) -> None:
        self._kept = [(v, v._value) for v in model_variables(self.model)]

    def emptied(self) -> bool:
        return any(v._value is None for v in model_variables(self.model))

    def recover(self) -> bool:
        """Returns whether the model holds values in every variable again."""
        if not self.emptied():
            return True
        if self._kept and not _deleted([value for _, value in self._kept]):
            for v, value in self._kept:
                if v._value is None:
                    v._value = value
        return not self.emptied()


def _deleted(values: Any) -> bool:
    import jax

    leaves = jax.tree_util.tree_leaves(values)
    return any(getattr(leaf, "is_deleted", lambda: False)() for leaf in leaves)
