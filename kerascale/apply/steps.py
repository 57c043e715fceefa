"""The plan's steps per call (Keras's `steps_per_execution`), set in place
on the model that trains and put back after.

Keras reads `model.steps_per_execution` where it builds its train and test
functions (TensorFlow loops the steps inside one `tf.function`; JAX calls its
jitted step that many times per call) and where `fit` lays out its epoch's
calls. Both backends keep the functions they built (`make_train_function`
returns the one it has): the value is set with them cleared, and put back
with the functions found here, so that a later `model.fit` reuses what it had
traced at its own value. The functions Keras traced at the plan's value are
kept on the model for the next run with the same value and the same
functions beneath (a notebook cell run again traces once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kerascale import _keras_compat as keras_compat
from kerascale.sense.model_facts import steps_per_call

# The functions that run `steps_per_execution` steps a call (`predict` is
# not `fit`'s: left as it is).
_TRACED = ("train_function", "test_function")
# Where a model keeps the functions Keras traced at kerascale's value.
_CACHE = "_kerascale_steps_traced"


@dataclasses.dataclass(frozen=True)
class _Traced:
    """What Keras traced at `n` steps a call, over the functions `beneath`
    (those the run found, traced at the model's own value) of the model as
    compiled then (`token`)."""

    n: int
    token: Any
    beneath: dict[str, Any]
    traced: dict[str, Any]

    def fits(self, n: int, token: Any, beneath: dict[str, Any]) -> bool:
        return (
            self.n == n
            and self.token is token
            and all(self.beneath[name] is beneath[name] for name in _TRACED)
        )


def apply(
    model: Any, n: int, *, builder: bool = False
) -> Callable[[bool], None] | None:
    """Sets `n` steps per call on `model`, and returns what puts back the
    value and the functions found here (`undo(ok)`; `ok`: the run ended
    without an exception, so what it traced is kept for the next); None
    where nothing changes. `builder`: the model a builder made, which keeps
    its own value where the plan's is Keras's default 1."""
    before = getattr(model, "steps_per_execution", 1)  # put back as found
    if n == steps_per_call(model) or (builder and n == 1):
        return None
    beneath = {name: getattr(model, name, None) for name in _TRACED}
    token = keras_compat.compile_token(model)
    kept = model.__dict__.get(_CACHE)
    reuse = kept is not None and all(beneath.values()) and kept.fits(n, token, beneath)
    model.steps_per_execution = n
    for name in _TRACED:
        setattr(model, name, kept.traced[name] if reuse else None)

    def undo(ok: bool = True) -> None:
        traced = {name: getattr(model, name, None) for name in _TRACED}
        if ok and all(beneath.values()) and all(traced.values()):
            model.__dict__[_CACHE] = _Traced(n, token, beneath, traced)
        model.steps_per_execution = before
        for name, fn in beneath.items():
            setattr(model, name, fn)

    return undo
