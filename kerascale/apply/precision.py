"""The plan's precision, set in place on the model that trains.

Its design: docs/design/modules.md, `kerascale.apply.precision`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras

from kerascale import _keras_compat as keras_compat

_TRACED = ("train_function", "test_function", "predict_function")
# Where a model keeps the functions Keras traced under kerascale's policy, for
# the next `fit` with the same plan (`apply(reuse=True)`). Kept on the model,
# so that they go when it goes (the functions hold the model).
_CACHE = "_kerascale_traced"


def forward_layers(model: Any) -> list[Any]:
    """The model and the layers its forward pass runs, in a fixed order: a
    graph model's (Functional, Sequential, a keras-hub task) are the layers
    of its graph, not what it merely holds (a keras-hub task's preprocessor
    and tokenizer, which must keep their own dtypes); any other layer's are
    the sublayers it holds."""
    seen: dict[int, Any] = {}

    def walk(layer: Any) -> None:
        if id(layer) in seen:
            return
        seen[id(layer)] = layer
        graph = isinstance(layer, keras.Sequential) or keras_compat.is_graph_model(
            layer
        )
        for child in layer.layers if graph else keras_compat.child_layers(layer):
            walk(child)

    walk(model)
    return list(seen.values())


def layers_to_change(model: keras.Model, default: Any = None) -> list[bool]:
    """For each layer of `forward_layers(model)`, in order, whether the plan's
    mixed policy goes on it: float32, not pinned by the user, and not (inside)
    an output layer of a graph model.

    Args:
        model: The user's model.
        default: The global policy object unpinned layers share (Keras's
            current one by default).
    """
    default = keras.config.dtype_policy() if default is None else default
    layers = forward_layers(model)
    keep = _output_layer_ids(layers)
    # Input layers and graph containers compute nothing of their own: they
    # keep their policy, and do not tell pinned layers apart (a loaded
    # model's input layer shares the global policy, its other layers do not).
    computes = [
        not isinstance(layer, keras.layers.InputLayer) and not _keeps_outputs(layer)
        for layer in layers
    ]
    shared = any(
        layer.dtype_policy is default
        for layer, yes in zip(layers, computes, strict=True)
        if yes
    )
    out = []
    for layer, yes in zip(layers, computes, strict=True):
        policy = layer.dtype_policy
        pinned = shared and policy is not default
        out.append(
            yes
            and policy.name == "float32"
            and policy.quantization_mode is None
            and not pinned
            and id(layer) not in keep
        )
    return out


def apply(
    model: keras.Model,
    policy: str,
    change: list[bool] | None = None,
    *,
    reuse: bool = False,
) -> Callable[[], None]:
    """Sets `policy` in place on `model` and returns what undoes it.

    Args:
        model: The model that trains.
        policy: A Keras dtype policy name ("mixed_bfloat16", ...).
        change: `layers_to_change` of the model whose layers these mirror
            (a copy of the user's model), else computed on `model`.
        reuse: Keep the functions Keras traces under `policy` for the next
            `apply` with the same policy on the same model, not compiled
            again since: a second `kerascale.fit` then costs what a second
            `model.fit` costs. Only for a run whose optimizer kerascale does
            not otherwise change (no accumulation, no loss scaling).

    Returns:
        A function that puts back the policies, the `call`, the optimizer
        and the traced functions found here; `undo(ok=False)` after a run
        that raised keeps nothing for reuse.
    """
    layers = forward_layers(model)
    if change is None or len(change) != len(layers):
        change = layers_to_change(model)
    saved_policies = [(layer, layer.dtype_policy) for layer in layers]
    saved_traced = {name: getattr(model, name, None) for name in _TRACED}
    saved_call = model.__dict__.get("call", _MISSING)
    saved_optimizer = getattr(model, "optimizer", None)

    # Compiled again since? `compile` makes its token anew (told by identity).
    key, token = (policy, tuple(change)), keras_compat.compile_token(model)

    def undo(ok: bool = True) -> None:
        # Only a run that ended well leaves traced functions worth reusing
        # (a failed first step may leave a half-traced one).
        if ok and reuse and policy != "float32" and any(change):
            traced = {name: getattr(model, name, None) for name in _TRACED}
            model.__dict__[_CACHE] = (key, token, traced)
        for layer, before in saved_policies:
            if layer.dtype_policy is not before:
                layer.dtype_policy = before
        if saved_call is _MISSING:
            model.__dict__.pop("call", None)
        else:
            model.__dict__["call"] = saved_call
        if getattr(model, "optimizer", None) is not saved_optimizer:
            model.optimizer = saved_optimizer
        if ok and reuse and not changes:
            # Nothing was changed: what Keras traced in the run is the model's
            # own, as a second model.fit would find it (else every call traced
            # and compiled its step again).
            return
        for name, fn in saved_traced.items():
            setattr(model, name, fn)

    changes = policy != "float32" and any(change)
    if not changes:
        return undo
    try:
        for layer, yes in zip(layers, change, strict=True):
            if yes:
                layer.dtype_policy = policy
        float32_outputs(model)  # a no-op where the output layers stay float32
        if policy == "mixed_float16":
            _scale_loss(model)
        kept, kept_token, traced = model.__dict__.get(_CACHE, (None, None, {}))
        same = reuse and kept == key and kept_token is token
        for name in _TRACED:
            setattr(model, name, traced.get(name) if same else None)
    except BaseException:
        undo()
        raise
    return undo


def float32_outputs(model: keras.Model) -> None:
    """Makes `model`'s `call` cast its floating outputs to float32 (on the
    instance: its class is untouched)."""
    call = model.call

    @functools.wraps(call)
    def float32_call(*args: Any, **kwargs: Any) -> Any:
        return keras.tree.map_structure(_as_float32, call(*args, **kwargs))

    model.__dict__["call"] = float32_call


def _scale_loss(model: keras.Model) -> None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return
    model.optimizer = keras.optimizers.LossScaleOptimizer(optimizer)


def _as_float32(t: Any) -> Any:
    dtype = getattr(t, "dtype", None)
    if dtype is not None and "float" in str(dtype) and "32" not in str(dtype):
        return keras.ops.cast(t, "float32")
    return t


def _keeps_outputs(model: Any) -> bool:
    """Whether `model` is a graph of layers (Sequential, Functional or a
    subclass of it such as a keras-hub task): its output layers can be told
    and kept float32, and it computes nothing of its own."""
    return isinstance(model, keras.Sequential) or keras_compat.is_graph_model(model)


def _output_layer_ids(layers: list[Any]) -> set[int]:
    """ids of the layers that produce the outputs of every graph model among
    `layers` (the model itself, a GAN's generator and discriminator, a VAE's
    encoder, a keras-hub backbone), and of all the layers inside them: what
    one model hands another stays float32, as a model's own outputs do, and
    a float32 block computes in float32 throughout (its residual adds mix
    its input with its sublayers' outputs)."""
    out: set[int] = set()
    for layer in layers:
        if isinstance(layer, keras.Sequential):
            last = [layer.layers[-1]] if layer.layers else []
        elif keras_compat.is_graph_model(layer):
            last = [_layer_named(layer, name) for name in layer.output_names]
        else:
            continue
        for kept in last:
            if kept is not None:
                out |= {id(x) for x in forward_layers(kept)}
    return out


def _layer_named(model: keras.Model, name: str) -> Any:
    try:
        return model.get_layer(name)
    except ValueError:  # an output made by an operation, not a layer
        return None


class _Missing:
    pass


_MISSING = _Missing()
