"""What planning needs to know about the user's model.

`model_facts` reads the model's dtype policy, whether it can be re-created
under another policy or strategy scope, and whether its variables already
live in the scope of a strategy the user passed. It builds an unbuilt model
from one sample of the data, as its first `fit` step would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import keras

from kerascale.errors import ModelError


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


def is_builder(model: Any) -> bool:
    """True for a zero-argument function that builds and compiles a model."""
    return callable(model) and not isinstance(model, keras.Model)


def is_functional(model: Any) -> bool:
    """Whether `model` is a Functional model (Keras does not export the class;
    `keras.Model(inputs, outputs)` makes one)."""
    return isinstance(model, keras.Model) and type(model).__name__ == "Functional"


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
    if isinstance(model, keras.Sequential) or is_functional(model):
        return ""
    try:
        model.get_config()
    except Exception as e:  # NotImplementedError for subclassed models, mostly.
        return (
            f"subclassed model {type(model).__name__} has no usable get_config() "
            f"({type(e).__name__})"
        )
    return ""


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


def architecture(model: keras.Model) -> str | None:
    """The model's architecture as canonical JSON (automatic names replaced,
    see `canonical_names`), or None for a model without a usable config."""
    try:
        config = json.loads(model.to_json())
    except Exception:  # subclassed without get_config, unserialisable layers
        return None
    return json.dumps(canonical_names(config), sort_keys=True)
