"""Shipping a model to a probe child: the user's own classes and functions
it must import to load the model, found here and imported there."""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterator
from typing import Any

from kerascale import _keras_compat as keras_compat


def import_objects(entries: list[dict[str, str]]) -> dict[str, Any]:
    """Imports the user's custom objects by module and name."""
    out: dict[str, Any] = {}
    for entry in entries:
        obj = importlib.import_module(entry["module"])
        for part in entry["qualname"].split("."):
            obj = getattr(obj, part)
        out[entry["name"]] = obj
    return out


def custom_objects(model: Any) -> tuple[list[dict[str, str]], str]:
    """The user's own classes and functions that a child must import to load
    `model`, and "" if they can all be shipped, else why not."""
    import keras

    found: dict[int, Any] = {}

    def note(obj):
        if isinstance(obj, types.FunctionType | type):
            target = obj
        elif isinstance(obj, str | int | float | bool | type(None)):
            return
        else:  # a loss, metric or optimizer instance
            target = type(obj)
        if not _is_library(getattr(target, "__module__", "")):
            found[id(target)] = target

    def visit(obj):
        if isinstance(obj, dict):
            for v in obj.values():
                visit(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                visit(v)
        else:
            note(obj)

    for layer in _all_layers(model):
        note(layer)
    if getattr(model, "compiled", False):
        visit(keras_compat.compile_arguments(model))
    entries, problems = [], []
    for obj in found.values():
        module = obj.__module__
        qualname = obj.__qualname__
        if "<lambda>" in qualname or "<locals>" in qualname:
            problems.append(f"{qualname} is defined inside a function")
            continue
        if module == "__main__":
            # A child would have to run your script again to define it, and
            # with it whatever else the script does (its own fit included).
            problems.append(f"{qualname} is defined in the script being run")
            continue
        entry = {"module": module, "qualname": qualname, "name": obj.__name__}
        entries.append(entry)
        registered = keras.saving.get_registered_name(obj)
        if registered and registered != obj.__name__:
            entries.append({**entry, "name": registered})
    return entries, "; ".join(problems)


def _is_library(module: str) -> bool:
    return (module or "").split(".")[0] in (
        "keras",
        "tensorflow",
        "tf_keras",
        "builtins",
        "numpy",
        "kerascale",
    )


def _all_layers(model: Any) -> Iterator[Any]:
    seen = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        stack.extend(keras_compat.tracked_layers(layer))
        stack.extend(getattr(layer, "layers", ()) or ())
