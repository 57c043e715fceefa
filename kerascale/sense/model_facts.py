"""What planning needs to know about the user's model.

`model_facts` reads the model's dtype policy, whether it can be re-created
under another policy or strategy scope, and whether its variables already
live in the scope of a strategy the user passed. It builds an unbuilt model
symbolically from the data's shapes, as Keras's `fit` does before its first
step: nothing `call()` does to the model's state runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascale._keras_compat.serialization import tensorflow_left_unimported
from kerascale._state import preserved_state, quiet_variable_reads
from kerascale.errors import ModelError
from kerascale.sense import backend as backend_lib


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What planning needs to know about the model.

    Attributes:
        policy: The model's dtype policy name (e.g. "float32").
        rebuildable: Whether kerascale can re-create the model under another
            policy or strategy scope (a builder function, or a built model
            whose every layer re-creates from its config, as cloning does).
            Tried only where a plan or a measurement would re-create it (a
            backend that places by scope, a model that cannot be borrowed).
        why_not_rebuildable: The reason, when it cannot.
        in_strategy_scope: Whether its variables already live in the scope of
            the strategy instance the user passed.
        builder: Whether the user passed a function that builds the model.
        borrowable: Whether a measurement can train the model itself and put
            every variable back afterwards: it is built, and Keras's own
            `train_step` and `test_step` train it (a custom step may keep
            state elsewhere, such as a GAN's second optimizer).
        why_not_borrowable: The reason, when it cannot.
        unplaceable: Why its variables could not be laid out over the
            plan's devices, when an attempt failed (JAX); "" otherwise.
        steps_per_execution: What you compiled it with (1: Keras's
            default, or a builder's model, compiled later).
    """

    policy: str = "float32"
    rebuildable: bool = True
    why_not_rebuildable: str = ""
    in_strategy_scope: bool = False
    builder: bool = False
    borrowable: bool = True
    why_not_borrowable: str = ""
    unplaceable: str = ""
    steps_per_execution: int = 1

    @property
    def measurable(self) -> bool:
        """Whether the batch search and the trials can train the model
        without changing it: on a copy, or borrowed."""
        return self.rebuildable or self.borrowable

    @property
    def why_not_measurable(self) -> str:
        return "" if self.measurable else self.why_not_borrowable

    def without_rebuild(self, why: str) -> ModelFacts:
        """These facts, for a model whose re-creation failed (`why`)."""
        return dataclasses.replace(self, rebuildable=False, why_not_rebuildable=why)

    def without_placing(self, why: str) -> ModelFacts:
        """These facts, for a model whose variables could not be laid out
        over the devices (`why`): that costs the distribution, not the
        re-creation."""
        return dataclasses.replace(self, unplaceable=why)


def is_trainer(model: Any) -> bool:
    """Whether `model` trains with Keras's own trainer: a `keras.Model`, or a
    layer with Keras's `Trainer` mixed in (Keras's own tests train such
    objects; they are not `keras.Model`s)."""
    if isinstance(model, keras.Model):
        return True
    return isinstance(model, keras.layers.Layer) and all(
        callable(getattr(model, name, None))
        for name in ("fit", "compile", "make_train_function")
    )


def is_builder(model: Any) -> bool:
    """True for a function that builds and compiles a model: a plain function,
    a `functools.partial`, or a callable object that is not a Keras layer."""
    return (
        callable(model)
        and not isinstance(model, keras.layers.Layer | keras.Operation)
        and not is_trainer(model)
    )


def is_functional(model: Any) -> bool:
    """Whether `model` is a Functional model (Keras does not export the class;
    `keras.Model(inputs, outputs)` makes one)."""
    return isinstance(model, keras.Model) and type(model).__name__ == "Functional"


def model_facts(
    model: Any, strategy: Any, *, sample: Callable[[], Any], scoped: bool = True
) -> ModelFacts:
    """What planning needs to know about `model`; builds an unbuilt model.

    A model that cannot be built from the data's shape (a GAN whose
    `train_step` is its only entry point, with no `call()`) is not an error:
    Keras trains it without building it, and so does kerascale, as it is.

    Args:
        model: A compiled `keras.Model` or a zero-argument builder function.
        strategy: The user's `strategy` option (a name or an instance).
        sample: Returns a one-sample input batch, to build an unbuilt model.
        scoped: Whether the run may place the model in a strategy's scope
            (False: one CPU, TensorFlow's default strategy; whether it
            re-creates is then asked only where it cannot be borrowed).

    Raises:
        ModelError: If `model` is neither a model nor a builder, or is not
            compiled.
    """
    if is_builder(model):
        return ModelFacts(policy=keras.config.dtype_policy().name, builder=True)
    if not is_trainer(model):
        raise ModelError(
            "model must be a keras.Model (or a layer with Keras's Trainer mixed "
            "in) or a zero-argument function that builds and compiles one. "
            f"Received: model of type {type(model).__name__}"
        )
    if not model.compiled:
        # Keras's own words (`Trainer._assert_compile_called`), which code
        # written against `model.fit` matches (keras-hub's task tests do).
        raise ModelError("You must call `compile()` before using the model.")
    unbuilt = ""
    if not model.built:
        try:
            build_symbolically(model, sample())
        except Exception as e:
            unbuilt = (
                "it is not built, and building it from the data's shape failed "
                f"({type(e).__name__}: {gist(e)})"
            )
    not_borrowable = borrow_problem(model)
    # Re-created only to place it in a strategy's scope (TensorFlow), or to
    # measure a copy of a model that cannot be borrowed: elsewhere nothing
    # uses the answer, so the round trip (every layer made anew from its
    # config) is not paid for.
    tried = (scoped and backend_lib.traits().places_by_scope) or bool(not_borrowable)
    why = unbuilt or (recreation_problem(model) if tried else "")
    if unbuilt and not_borrowable in ("", "it is not built"):
        not_borrowable = unbuilt
    in_scope = (
        not isinstance(strategy, str)
        and getattr(model, "distribute_strategy", None) is strategy
    )
    return ModelFacts(
        policy=model.dtype_policy.name,
        rebuildable=not why,
        why_not_rebuildable=why,
        in_strategy_scope=in_scope,
        borrowable=not not_borrowable,
        why_not_borrowable=not_borrowable,
        steps_per_execution=steps_per_call(model),
    )


def steps_per_call(model: Any) -> int:
    """The training steps per call `model` runs (Keras's
    `steps_per_execution`: what it was compiled with, or what a run set);
    1 for Keras's default, or where it has none."""
    value = getattr(model, "steps_per_execution", 1)
    return value if isinstance(value, int) and value > 1 else 1


def state_bytes(model: Any) -> int:
    """The bytes of what a checkpoint copies of `model`: its variables and
    its optimizer's. An optimizer not built yet is counted by the slots a
    copy of it makes for one variable (Adam: 2 a variable); 0 for a builder
    or a model that is not built."""
    if not is_trainer(model) or not model.built:
        return 0
    weights = sum(_nbytes(v) for v in model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return weights
    if optimizer.built:
        return weights + sum(_nbytes(v) for v in optimizer.variables)
    trainable = sum(_nbytes(v) for v in model.trainable_variables)
    return weights + trainable * _slots_per_variable(optimizer)


def _slots_per_variable(optimizer: Any) -> int:
    """How many variables of a variable's size `optimizer` keeps for each it
    trains, from a copy built for a variable of one element (2 where the
    copy cannot be made: Adam's, the common case and the larger)."""
    try:
        copy = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        one = keras.Variable(np.zeros((1,), "float32"), name="kerascale_slot_probe")
        copy.build([one])
        return sum(1 for v in copy.variables if tuple(v.shape) == (1,))
    except Exception:
        return 2


def _nbytes(variable: Any) -> int:
    name = keras.backend.standardize_dtype(variable.dtype)
    try:
        itemsize = np.dtype(name).itemsize
    except TypeError:  # bfloat16, float8: ml_dtypes names them for NumPy
        import ml_dtypes

        itemsize = np.dtype(getattr(ml_dtypes, name)).itemsize
    return int(math.prod(variable.shape)) * itemsize


def build_symbolically(model: Any, sample: Any) -> None:
    """Builds `model` by calling it on symbolic tensors shaped like `sample`
    (batch dimension unknown), as Keras's own `fit` builds it before its
    first step: `call()` runs in a scratch graph, so nothing it assigns or
    draws (a counter, a seed) moves in the user's model."""
    import numpy as np

    def symbolic(a: Any) -> Any:
        if a is None:
            return None
        a = a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a)
        dtype = keras.backend.standardize_dtype(a.dtype)
        return keras.KerasTensor((None, *tuple(a.shape)[1:]), dtype)

    model(keras.tree.map_structure(symbolic, sample))


def borrow_problem(model: keras.Model) -> str:
    """ "" when a measurement can train `model` itself and put it back (it is
    built, and Keras's own train_step and test_step train it), else why not
    (its own steps first: the more lasting reason)."""
    own = [
        name
        for name in ("train_step", "test_step")
        if getattr(type(model), name) is not getattr(keras.Model, name)
    ]
    if own:
        return (
            f"it trains with its own {' and '.join(own)} "
            f"({type(model).__name__}), which may keep state elsewhere"
        )
    if not model.built:
        return "it is not built"
    return ""


def recreation_problem(model: keras.Model) -> str:
    """ "" when the model can be re-created, else why not: found by trying
    what re-creating does, a round trip of each layer's config (of the
    model's own config, for a subclassed model)."""
    if isinstance(model, keras.Sequential) or is_functional(model):
        for layer in model.layers:
            if isinstance(layer, keras.Sequential) or is_functional(layer):
                why = recreation_problem(layer)
            elif isinstance(layer, keras.layers.InputLayer):
                continue
            else:
                why = _round_trip(layer, f"layer {layer.name!r}")
            if why:
                return why
        return ""
    return _round_trip(model, f"model {type(model).__name__}")


# Each layer's last round trip, by its config: a notebook's repeated `fit`
# on one model re-created every layer each call (2 ms of a 10 ms plan).
_ROUND_TRIPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _round_trip(layer: Any, what: str) -> str:
    why, key = "", None
    try:
        with tensorflow_left_unimported():
            config = layer.get_config()
            key = _config_key(config)
            known = _ROUND_TRIPS.get(layer) if key is not None else None
            if known is not None and known[0] == key:
                return known[1]
            with preserved_state():  # initializers draw seeds from Python's random
                type(layer).from_config(config)
    except Exception as e:
        why = (
            f"{what} ({type(layer).__name__}) does not re-create from its config: "
            f"{type(e).__name__}: {gist(e)}"
        )
    if key is not None:
        _ROUND_TRIPS[layer] = (key, why)
    return why


def _config_key(config: Any) -> str | None:
    """A layer's config as text, to tell a changed one; None where it has
    none (its round trip is then tried every time)."""
    try:
        return json.dumps(config, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return None


def gist(e: BaseException) -> str:
    """The first sentence of an error's message, on one line (Keras's
    serialization errors go on with a page of example code). Where Keras
    wraps an error from a layer's call, the wrapped error's first line too."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    text = " ".join(" ".join(lines).split())
    end = text.find(". ")
    first = text[: end + 1] if 0 < end < 300 else text[:300]
    if "Exception encountered when calling" in lines[0]:
        inner = [
            ln
            for ln in lines[1:]
            if not ln.startswith(("Arguments received", "•", "\x1b[1mCould not"))
        ]
        if inner:
            first = f"{lines[0]} {_ansi_free(inner[0])[:300]}"
    return first


def _ansi_free(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def canonical_names(config: Any) -> Any:
    """The model's config with layer and model names replaced by their order
    of appearance: Keras numbers automatic names per session ("dense_3"), and
    a model rebuilt in a notebook cell must still find its cached search."""
    names: dict[str, str] = {}

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            cls = str(node.get("class_name", ""))
            inner = node.get("config")
            if isinstance(inner, dict) and "Policy" not in cls:
                name = inner.get("name")
                if isinstance(name, str) and name not in names:
                    names[name] = f"#{len(names)}"
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    def rename(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: rename(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rename(v) for v in node]
        if isinstance(node, str):
            return names.get(node, node)
        return node

    collect(config)
    return rename(config)


def architecture(
    model: keras.Model, *, with_compile_config: bool = False
) -> str | None:
    """The model's architecture as canonical JSON (automatic names replaced,
    see `canonical_names`), or None for a model without a usable config.
    Its layers only: how it is compiled (`compile_config`, which holds the
    learning rate a callback may have moved) is fingerprinted apart, by
    `compiled` (`with_compile_config`: as checkpoints before that recorded
    it)."""
    try:
        with quiet_variable_reads(), tensorflow_left_unimported():
            config = json.loads(model.to_json())
    except Exception:  # subclassed without get_config, unserialisable layers
        return None
    if not with_compile_config:
        config.pop("compile_config", None)
    return json.dumps(canonical_names(config), sort_keys=True)


def compiled(model: Any) -> str:
    """How `model` is compiled (its optimizer, loss and metrics) as canonical
    JSON, without the optimizer's learning rate where it is a number: a
    callback moves that as the run goes (`ReduceLROnPlateau`, kerascale's
    own learning-rate rule), and it neither changes what a step holds in
    memory nor what a checkpoint's variables are."""
    try:
        with quiet_variable_reads(), tensorflow_left_unimported():
            config = model.get_compile_config()
    except Exception:
        return repr(getattr(model, "optimizer", None))
    return json.dumps(
        canonical_names(without_learning_rate(config)), sort_keys=True, default=str
    )


def without_learning_rate(config: Any) -> Any:
    """`config` (an optimizer's, or a compile config) without the learning
    rate where it is a number; a schedule's config stays, as it is fixed."""
    if isinstance(config, dict):
        return {
            k: without_learning_rate(v)
            for k, v in config.items()
            if not (k == "learning_rate" and isinstance(v, int | float))
        }
    if isinstance(config, list):
        return [without_learning_rate(v) for v in config]
    return config


def largest_output_elements(model: Any) -> int:
    """The most elements one sample puts in a single layer's output (nested
    models' layers included), from the layers' symbolic outputs; 0 where no
    layer has one (a subclassed model, a layer shared between calls)."""
    return max(_output_sizes(model), default=0)


def output_elements(model: Any) -> int:
    """The elements one sample puts in all layers' outputs together (nested
    models' layers included); 0 where no layer has a symbolic output."""
    return sum(_output_sizes(model))


def _output_sizes(model: Any) -> list[int]:
    sizes = []
    for layer in getattr(model, "layers", ()):
        if getattr(layer, "layers", None):
            sizes += _output_sizes(layer)
        try:
            outputs = keras.tree.flatten(layer.output)
        except (AttributeError, ValueError):
            continue
        for out in outputs:
            dims = tuple(getattr(out, "shape", ()) or ())[1:]
            if dims and all(isinstance(d, int) for d in dims):
                sizes.append(math.prod(dims))
    return sizes
