"""The model that trains when it cannot be the user's own: a copy under a
strategy's scope, and its weights put back into the user's model afterwards.

Its design: docs/design/modules.md, `kerascale.apply.model`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras

from kerascale import _keras_compat as keras_compat
from kerascale._keras_compat.serialization import tensorflow_left_unimported
from kerascale._state import preserved_state, quiet_variable_reads, value_of
from kerascale.apply import precision
from kerascale.errors import ModelError, warn
from kerascale.plan.fallback import Recoverable
from kerascale.sense.model_facts import gist, is_builder, is_functional

logger = logging.getLogger("kerascale")


class CannotRecreate(Recoverable):
    """The model could not be re-created (the message says why). A probe or
    trial trains the model itself instead; elsewhere it is the ladder's
    "recreate" rung (`plan.fallback`): decided again without re-creating,
    and the plan says what was not applied."""

    rung = "recreate"
    placing = False


class CannotPlace(CannotRecreate):
    """The model's variables could not be laid out over the plan's devices
    (JAX): the ladder's "place" rung, decided again on one device, and said."""

    rung = "place"
    placing = True


@contextlib.contextmanager
def global_policy(policy: str) -> Iterator[None]:
    """Sets Keras's global dtype policy inside the block, restores it after."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def _copy(model: keras.Model) -> keras.Model:
    """A new model of `model`'s own class from its config (Keras's
    serialization, not `clone_model`, which turns a subclass of Functional
    such as a keras-hub task into a plain Functional model). Keras's own
    Functional and Sequential classes are cloned layer by layer, which also
    re-creates unregistered custom layers."""
    # clone_model also compiles the clone through a serialised compile config,
    # which fails on unregistered custom losses; `compile_like` does it better.
    compiled, model.compiled = model.compiled, False
    try:
        if type(model) is keras.Sequential or is_functional(model):
            return keras.models.clone_model(model, recursive=True)
        return type(model).from_config(model.get_config())
    finally:
        model.compiled = compiled


def _check_same(model: keras.Model, new: keras.Model) -> None:
    """Raises unless `new` is `model`'s class with the same weights by shape."""
    if type(new) is not type(model):
        raise TypeError(
            f"the copy is a {type(new).__name__}, not a {type(model).__name__}"
        )
    mine = [tuple(v.shape) for v in model.weights]
    theirs = [tuple(v.shape) for v in new.weights]
    if mine != theirs:
        raise ValueError(
            f"the copy's weights differ from the model's: shapes {theirs[:4]} "
            f"against {mine[:4]}{' ...' if len(mine) > 4 else ''}"
        )


def recreate(
    model: keras.Model | Callable[[], keras.Model],
    policy: str,
    strategy: Any,
) -> keras.Model:
    """A new model like `model` under `strategy`'s scope, compiled.

    A model is copied as its own class, in its own dtype policies (the plan's
    precision is then set in place, `kerascale.apply.precision`), and checked:
    the same class and the same weights by shape, then the weights, the
    optimizer state and the compile settings copied. A builder is called
    under `policy` as Keras's global policy. Runs under `preserved_state`:
    the global dtype policy and the random state are unchanged afterwards.

    Args:
        model: A compiled Keras model, or a zero-argument function that
            builds and compiles one.
        policy: The dtype policy a builder builds under.
        strategy: A `tf.distribute.Strategy`, a `keras.distribution` one, or
            None (JAX on one device).

    Returns:
        The new, compiled model.

    Raises:
        CannotRecreate: When a model cannot be copied as its own class with
            the same weights.
        ModelError: When a builder does not return a compiled model.
    """
    # On JAX without a distribution (one device) there is no scope to enter.
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with preserved_state(), scope:
        if is_builder(model):
            with global_policy(policy):
                return _float32_outputs(_built(model), policy)
        try:
            # Configs are read and made without importing TensorFlow where it
            # is not imported (keras_compat section 8).
            with tensorflow_left_unimported():
                new = _copy(model)
                if model.built and model.weights:
                    if not new.built:
                        new.build_from_config(model.get_build_config())
                    _check_same(model, new)
                    new.set_weights(model.get_weights())
                compile_like(model, new)
                copy_optimizer_state(model, new)
        except Exception as e:
            raise CannotRecreate(
                f"re-creating it failed: {type(e).__name__}: {gist(e)}"
            ) from e
    return new


def _float32_outputs(model: keras.Model, policy: str) -> keras.Model:
    """Makes `model`'s floating outputs float32 under a mixed `policy`, where
    its output layers cannot be re-created as float32 (a subclassed model, or
    what a builder returns): its `call` casts them (Keras's mixed-precision
    guide: outputs in float32). A layer you pinned to float32 computes in
    float32 as it is."""
    if policy.startswith("mixed"):
        precision.float32_outputs(model)
    return model


def _built(builder: Callable[[], keras.Model]) -> keras.Model:
    new = builder()
    if not isinstance(new, keras.Model):
        raise ModelError(
            "The model builder must return a keras.Model. Received: "
            f"{type(new).__name__}"
        )
    if not new.compiled:
        raise ModelError(
            "The model builder must return a compiled model: call "
            "model.compile(optimizer=..., loss=...) inside it."
        )
    return new


def compile_like(src: keras.Model, dst: keras.Model) -> None:
    """Compiles `dst` with `src`'s optimizer config, loss, metrics,
    steps_per_execution and jit_compile; fresh objects, so that their state is
    created in the current scope."""
    try:
        with quiet_variable_reads():
            config = src.get_compile_config()
        dst.compile_from_config(config)
        return
    except Exception as e:  # Custom objects that are not registered for serialization.
        logger.debug("compile config did not round-trip (%s); copying objects", e)
    raw = keras_compat.compile_arguments(src)
    optimizer = raw.get("optimizer")
    if isinstance(optimizer, keras.optimizers.Optimizer):
        with quiet_variable_reads():
            raw["optimizer"] = type(optimizer).from_config(optimizer.get_config())
    for key in ("metrics", "weighted_metrics"):
        raw[key] = _fresh_metrics(raw.get(key))
    dst.compile(**raw)


def _fresh_metrics(metrics: Any) -> Any:
    if isinstance(metrics, keras.metrics.Metric):
        return type(metrics).from_config(metrics.get_config())
    if isinstance(metrics, dict):
        return {k: _fresh_metrics(v) for k, v in metrics.items()}
    if isinstance(metrics, list | tuple):
        return type(metrics)(_fresh_metrics(m) for m in metrics)
    return metrics


def accumulation_steps(model: Any) -> int:
    """Batches per optimizer update of `model`'s optimizer (1 without
    gradient accumulation)."""
    optimizer = core_optimizer(getattr(model, "optimizer", None))
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)


def core_optimizer(optimizer: Any) -> Any:
    """The optimizer that holds the slots: the inner one of a LossScaleOptimizer."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def copy_optimizer_state(src: keras.Model, dst: keras.Model) -> bool:
    """Copies optimizer iterations and slots from `src` to `dst` when `src`'s
    optimizer has been built (trained before). Returns whether it copied."""
    s = core_optimizer(getattr(src, "optimizer", None))
    d = core_optimizer(getattr(dst, "optimizer", None))
    if s is None or d is None or not getattr(s, "built", False):
        return False
    if not d.built:
        d.build(dst.trainable_variables)
    # Gradient accumulators are scratch (zero between windows), present on
    # one side only when accumulation is on for one optimizer.
    sv, dv = _without_accumulators(s), _without_accumulators(d)
    if len(sv) != len(dv) or any(
        tuple(a.shape) != tuple(b.shape) for a, b in zip(sv, dv, strict=True)
    ):
        warn(
            f"Optimizer state not carried over: {len(sv)} variables in "
            f"{type(s).__name__}, {len(dv)} in {type(d).__name__}."
        )
        return False
    for a, b in zip(sv, dv, strict=True):
        b.assign(value_of(a))
    return True


def _without_accumulators(optimizer: Any) -> list[Any]:
    acc = {id(v) for v in keras_compat.accumulators(optimizer)}
    return [v for v in optimizer.variables if id(v) not in acc]


def copy_back(trained: keras.Model, user_model: keras.Model) -> None:
    """Puts the trained weights (and optimizer state) into the user's model."""
    user_model.set_weights(trained.get_weights())
    copy_optimizer_state(trained, user_model)


@contextlib.contextmanager
def borrow(model: keras.Model) -> Iterator[keras.Model]:
    """Lends `model` to a measurement that trains it, and puts it back.

    Every variable the model, its optimizer and its metrics hold (weights,
    seed generators, optimizer slots and iterations, metric totals) gets its
    value back on exit, whatever happened, and so do the random state, the
    dtype policy, `stop_training` and `history`. An optimizer that is not
    built yet is built first, under the model's strategy, as its first
    training step would build it, so that its initial values are what is put
    back.

    Use it where a copy cannot be made (`recreate` failed); a copy is
    cheaper to throw away than this is to restore.
    """
    opt = getattr(model, "optimizer", None)
    with preserved_state():
        if opt is not None and not opt.built:
            with model.distribute_strategy.scope():
                opt.build(model.trainable_variables)
        held = [
            *model.variables,
            *getattr(opt, "variables", ()),
            *model.metrics_variables,
        ]
        unique = list({id(v): v for v in held}.values())
        saved = [(v, value_of(v)) for v in unique]
        history = model.__dict__.get("history")
        try:
            yield model
        finally:
            for variable, value in saved:
                variable.assign(value)
            model.stop_training = False
            model.__dict__["history"] = history
