"""Mixed precision: which dtype policy is faster here, and applying it.

A Keras dtype policy is fixed when a layer is constructed, and variables must
be created under the strategy's scope, so a float32 model built outside any
scope is re-created: cloned under the policy and strategy scope, weights
copied, re-compiled with the user's own compile settings. The layers that
produce the model's outputs stay float32 (Keras's mixed-precision guide: a
softmax in float16 is numerically unsafe). The global dtype policy is left as
it was found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras

from kerascale.errors import ModelError
from kerascale.hardware import Hardware

logger = logging.getLogger("kerascale")

CHOICES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What planning needs to know about the model.

    Attributes:
        policy: The model's dtype policy name (e.g. "float32").
        rebuildable: Whether kerascale can re-create the model under another
            policy or strategy scope (a builder function, or a model that can
            be cloned).
        why_not_rebuildable: The reason, when it cannot.
        in_strategy_scope: Whether its variables already live in the scope of
            the strategy instance the user passed.
        builder: Whether the user passed a function that builds the model.
    """

    policy: str = "float32"
    rebuildable: bool = True
    why_not_rebuildable: str = ""
    in_strategy_scope: bool = False
    builder: bool = False


def choose(
    hw: Hardware, requested: str, *, model_policy: str = "float32"
) -> tuple[str, str, tuple[str, ...]]:
    """Picks the dtype policy. Pure.

    Args:
        hw: The hardware.
        requested: "auto" or a policy name from `CHOICES`.
        model_policy: The model's current policy; "auto" keeps a mixed policy
            the user already chose.

    Returns:
        (policy name, reason, warnings).
    """
    if requested != "auto":
        return requested, "you asked for it", _explicit_warnings(hw, requested)
    if model_policy != "float32":
        return model_policy, f"your model already uses {model_policy}", ()
    if hw.tpu is not None:
        return "mixed_bfloat16", "TPU: bfloat16 is native on TPUs", ()
    if hw.gpus:
        cc = hw.min_compute_capability
        if cc is None:
            return "float32", "GPU compute capability unknown: float32 is safe", ()
        spelled = "{}.{}".format(*cc)
        lowest = " (lowest across GPUs)" if not hw.gpus_homogeneous else ""
        if cc >= (8, 0):
            return (
                "mixed_bfloat16",
                f"GPU compute capability {spelled}{lowest} >= 8.0: bf16 tensor "
                "cores, and no loss scaling needed",
                (),
            )
        if cc >= (7, 0):
            return (
                "mixed_float16",
                f"GPU compute capability {spelled}{lowest}: float16 tensor cores, "
                "with dynamic loss scaling",
                (),
            )
        return (
            "float32",
            f"GPU compute capability {spelled}{lowest} < 7.0: no tensor cores",
            (),
        )
    if hw.cpu.bf16:
        return (
            "mixed_bfloat16",
            f"CPU has native bf16 ({', '.join(hw.cpu.bf16_flags)}): bf16 math "
            "steps faster than float32",
            (),
        )
    return "float32", "CPU without native bf16: mixed precision would be slower", ()


def _explicit_warnings(hw: Hardware, policy: str) -> tuple[str, ...]:
    on = hw.accelerator
    if policy == "mixed_float16" and on == "cpu":
        return (
            "mixed_float16 on CPU is emulated: several times slower than float32. "
            'Use precision="auto".',
        )
    if policy == "mixed_float16" and on == "tpu":
        return ("TPUs do not support float16 well; mixed_bfloat16 is native.",)
    if policy == "mixed_bfloat16" and on == "cpu" and not hw.cpu.bf16:
        return ("This CPU has no native bf16: mixed_bfloat16 will be slower.",)
    if policy == "mixed_bfloat16" and on == "gpu":
        cc = hw.min_compute_capability
        if cc is not None and cc < (8, 0):
            return (
                "bf16 needs compute capability >= 8.0; this GPU has "
                "{}.{}: mixed_bfloat16 will be slow.".format(*cc),
            )
    return ()


# --- Applying a policy --------------------------------------------------------


@contextlib.contextmanager
def global_policy(policy: str) -> Iterator[None]:
    """Sets Keras's global dtype policy inside the block, restores it after."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def is_builder(model: Any) -> bool:
    """True for a zero-argument function that builds and compiles a model."""
    return callable(model) and not isinstance(model, keras.Model)


def model_facts(model: Any, strategy: Any, *, sample: Callable[[], Any]) -> ModelFacts:
    """What planning needs to know about `model`; builds an unbuilt model.

    Args:
        model: A compiled `keras.Model` or a zero-argument builder function.
        strategy: The user's `strategy` option (a name or an instance).
        sample: Returns a one-sample input batch, to build an unbuilt model.

    Raises:
        ModelError: If `model` is neither, is not compiled, or cannot be built.
    """
    if is_builder(model):
        return ModelFacts(policy=keras.config.dtype_policy().name, builder=True)
    if not isinstance(model, keras.Model):
        raise ModelError(
            "model must be a keras.Model or a zero-argument function that builds "
            f"and compiles one. Received: model of type {type(model).__name__}"
        )
    if not model.compiled:
        raise ModelError(
            "model must be compiled before training: call "
            "model.compile(optimizer=..., loss=...) first, as for model.fit."
        )
    if not model.built:
        try:
            model(sample())
        except Exception as e:
            raise ModelError(
                "The model is not built and could not be built from the data's "
                f"shape ({type(e).__name__}: {e}). Give it an Input layer, or "
                "call model.build(input_shape) first."
            ) from e
    why = cloneability(model)
    in_scope = not isinstance(strategy, str) and model.distribute_strategy is strategy
    return ModelFacts(
        policy=model.dtype_policy.name,
        rebuildable=not why,
        why_not_rebuildable=why,
        in_strategy_scope=in_scope,
    )


def cloneability(model: keras.Model) -> str:
    """ "" when the model can be re-created, else why not."""
    if isinstance(model, keras.Sequential) or _is_functional(model):
        return ""
    try:
        model.get_config()
    except Exception as e:  # NotImplementedError for subclassed models, mostly.
        return (
            f"subclassed model {type(model).__name__} has no usable get_config() "
            f"({type(e).__name__})"
        )
    return ""


def _is_functional(model: Any) -> bool:
    # keras.Model(inputs, outputs) makes a Functional, which Keras does not
    # export; its config lists its output layers.
    return isinstance(model, keras.Model) and type(model).__name__ == "Functional"


def _output_layer_ids(model: keras.Model) -> set[int]:
    """ids of the layers that produce `model`'s outputs, looking through nested
    Sequential and Functional models."""
    if isinstance(model, keras.Sequential):
        last = [model.layers[-1]] if model.layers else []
    elif _is_functional(model):
        names = [entry[0] for entry in _as_list_of_entries(model)]
        last = [model.get_layer(n) for n in names]
    else:
        return set()
    out = set()
    for layer in last:
        out.add(id(layer))
        if isinstance(layer, keras.Model):
            out |= _output_layer_ids(layer)
    return out


def _as_list_of_entries(model: keras.Model) -> list:
    entries = model.get_config()["output_layers"]
    # A single output is [name, node, tensor]; several are [[...], [...]].
    if entries and isinstance(entries[0], str):
        return [entries]
    return list(entries)


def _clone(model: keras.Model, policy: str) -> keras.Model:
    keep_float32 = _output_layer_ids(model)

    def clone_layer(layer):
        config = layer.get_config()
        if id(layer) in keep_float32:
            config["dtype"] = "float32"
        elif layer.dtype_policy.name == "float32":
            config["dtype"] = policy
        return layer.__class__.from_config(config)

    # clone_model also compiles the clone through a serialised compile config,
    # which fails on unregistered custom losses; `compile_like` does it better.
    compiled, model.compiled = model.compiled, False
    try:
        if isinstance(model, keras.Sequential) or _is_functional(model):
            return keras.models.clone_model(
                model, clone_function=clone_layer, recursive=True
            )
        return keras.models.clone_model(model)
    finally:
        model.compiled = compiled


def rebuild(
    model: keras.Model | Callable[[], keras.Model],
    policy: str,
    strategy: Any,
) -> keras.Model:
    """Re-creates `model` under `policy` and `strategy`'s scope, compiled.

    Args:
        model: A compiled Keras model (cloned, weights and optimizer state
            copied), or a zero-argument function that builds and compiles one
            (called under the policy and scope).
        policy: The dtype policy name.
        strategy: A `tf.distribute.Strategy`.

    Returns:
        The new, compiled model. The global dtype policy is unchanged.
    """
    with strategy.scope(), global_policy(policy):
        if is_builder(model):
            new = model()
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
        new = _clone(model, policy)
        if model.built and model.weights:
            if not new.built:
                new.build_from_config(model.get_build_config())
            new.set_weights(model.get_weights())
        compile_like(model, new)
        copy_optimizer_state(model, new)
    return new


def compile_like(src: keras.Model, dst: keras.Model) -> None:
    """Compiles `dst` with `src`'s optimizer config, loss, metrics,
    steps_per_execution and jit_compile; fresh objects, so that their state is
    created in the current scope."""
    try:
        dst.compile_from_config(src.get_compile_config())
        return
    except Exception as e:  # Custom objects that are not registered for serialization.
        logger.debug("compile config did not round-trip (%s); copying objects", e)
    # Keras keeps the compile arguments themselves in this SerializableDict.
    raw = dict(src._compile_config.config)
    optimizer = raw.get("optimizer")
    if isinstance(optimizer, keras.optimizers.Optimizer):
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
        logger.warning(
            "Optimizer state not carried over: %d variables in %s, %d in %s.",
            len(sv),
            type(s).__name__,
            len(dv),
            type(d).__name__,
        )
        return False
    for a, b in zip(sv, dv, strict=True):
        b.assign(a.numpy())
    return True


def _without_accumulators(optimizer: Any) -> list[Any]:
    acc = {id(v) for v in getattr(optimizer, "_accumulated_gradients", None) or ()}
    return [v for v in optimizer.variables if id(v) not in acc]


def copy_back(trained: keras.Model, user_model: keras.Model) -> None:
    """Puts the trained weights (and optimizer state) into the user's model."""
    user_model.set_weights(trained.get_weights())
    copy_optimizer_state(trained, user_model)
