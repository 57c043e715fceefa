"""The door's words (issue 81): the arguments a door hands on to Keras's
`fit`, checked at the door as Keras would check them, before anything is
measured; and which errors the door raises again from its own frame.

A misspelt keyword, or an `epochs` Keras cannot count, would otherwise reach
Keras only after the plan (a batch search, trials): the same error, seconds
later and under a longer traceback. Here it is raised first, of the type
and with the words Keras's `fit` (or Python, for a keyword) would use, and
a hint after them.

What "Keras's `fit`" is: the installed model class's own `fit`, and where
that takes `**kwargs` (keras-hub's tasks, a user's subclass), the `fit`s
above it in its classes, up to one that does not; a chain that takes
`**kwargs` to its end accepts every name. A builder (a function that makes
the model) is checked against `keras.Model.fit`.
"""

from __future__ import annotations

import difflib
import inspect
import math
import operator
import os
from collections.abc import Iterable, Mapping
from typing import Any

import keras

from kerascale.errors import ConfigurationError, DataError, ModelError
from kerascale.sense import arrays
from kerascale.sense import data_facts as sense_data

# Keras's `fit` counts these (a `range`, a division): a value that is not an
# integer raises TypeError there.
_COUNTS = ("epochs", "initial_epoch", "steps_per_epoch")
# Passed by the door itself, never by the user through **fit_kwargs.
_DOOR_OWN = ("x", "y", "batch_size")


def refused(
    model: Any, fit_kwargs: dict[str, Any], *, door: str, own: Iterable[str] = ()
) -> TypeError | None:
    """The TypeError Keras's `fit` of `model` would raise for `fit_kwargs`
    (an unknown keyword, with the nearest name of Keras's or of the door's
    own options, `own`; a count that is not an integer), or None. The door
    raises it, so that the traceback ends at the user's call."""
    names = _accepted(model)
    if names is not None:
        for name in fit_kwargs:
            if name not in names:
                return TypeError(
                    f"{door}() got an unexpected keyword argument '{name}'"
                    + _nearest(name, [*sorted(names - set(_DOOR_OWN)), *own])
                )
    for name in _COUNTS:
        value = fit_kwargs.get(name)
        if name not in fit_kwargs or (value is None and name == "steps_per_epoch"):
            continue
        try:
            operator.index(value)
        except TypeError as e:
            return TypeError(
                f"{e} ({door}'s {name}={value!r}: Keras's fit counts it; pass an int)"
            )
    return None


def batch_size(value: Any, x: Any, fit_kwargs: dict[str, Any]) -> Any:
    """`batch_size` as kerascale reads it. Keras's `fit` takes None or 0 as
    its own choice: for arrays, a batch that covers the samples it trains
    on (after `validation_split`) in `steps_per_epoch` steps, else 32 (that
    int, here); for batched data (a dataset, a generator) the data's own
    batch (kerascale's "auto" keeps it too). Every other value is checked by
    `Options.validate`."""
    if not (value is None or (type(value) is int and value == 0)):
        return value
    if sense_data.is_dataset(x) or isinstance(x, keras.utils.PyDataset):
        return "auto"
    if not (isinstance(x, Mapping) or arrays.array_like(x)):
        return "auto"
    steps = fit_kwargs.get("steps_per_epoch")
    leaves = [a for a in keras.tree.flatten(x) if hasattr(a, "shape")]
    n = leaves[0].shape[0] if leaves and len(leaves[0].shape) else None
    if not (steps and isinstance(steps, int) and isinstance(n, int)):
        return 32
    # Keras's split (`train_validation_split`): the first part trains.
    split = fit_kwargs.get("validation_split") or 0.0
    if not isinstance(split, int | float):  # Keras says what is wrong with it
        split = 0.0
    trained = math.floor(n * (1.0 - split))
    return max(1, math.ceil(trained / steps))


# Errors about the user's call, data or model. Raised before Keras's `fit`
# runs, the door raises them again from its own frame: the traceback is the
# user's line and the message, not kerascale's layers.
USERS = (ConfigurationError, DataError, ModelError)
_KERAS = os.path.dirname(keras.__file__) + os.sep


def raised_in_keras(error: BaseException) -> bool:
    """Whether `error` was raised while Keras's own code ran (training): its
    traceback stays as it is."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_KERAS):
            return True
        tb = tb.tb_next
    return False


def own_fit(model: Any) -> str:
    """The class whose `fit` a model's class uses where it is not Keras's
    (keras-hub's tasks, a user's subclass); "" for Keras's own or a builder."""
    if not isinstance(model, keras.Model):
        return ""
    for cls in type(model).__mro__:
        if "fit" in cls.__dict__:
            module = cls.__module__ or ""
            return "" if module.split(".")[0] == "keras" else cls.__name__
    return ""


def _accepted(model: Any) -> set[str] | None:
    """The keyword names `model`'s `fit` chain accepts; None for any."""
    owner = type(model) if isinstance(model, keras.Model) else keras.Model
    names: set[str] = set()
    for cls in owner.__mro__:
        fit = cls.__dict__.get("fit")
        if fit is None:
            continue
        try:
            parameters = inspect.signature(fit).parameters.values()
        except (TypeError, ValueError):  # a C or wrapped fit: not read
            return None
        names |= {
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        }
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return names
    return None


def _nearest(name: str, candidates: list[str]) -> str:
    near = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean '{near[0]}'?" if near else ""
