"""The first estimate of a training step, before anything is measured:
what `budget.RunBudget` weighs the measurements against until the run times
its own steps. Compiled where the backend compiles one (`engines`, JAX:
`measure.jax.estimate`), else eager forward passes of the model.

Its design: docs/design/modules.md, `kerascale.measure.first_step`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from kerascale import _keras_compat as keras_compat
from kerascale._state import preserved_state, value_of
from kerascale.measure import engines
from kerascale.measure.probe_data import synthetic_batch
from kerascale.sense import data_facts, samples
from kerascale.sense.model_facts import is_trainer

if TYPE_CHECKING:
    from kerascale.sense.data_facts import DataFacts

TRAIN_PER_FORWARD = 2.0  # a training step, in forward passes
FORWARD_BATCH = 32  # timed, when a smaller first pass predicts it is quick
FIRST_BATCH = 4
FORWARD_MAX_SECONDS = 0.25  # the FORWARD_BATCH pass only under this


# The first estimates taken in this process, per model and input shape: code
# that calls `fit` in a loop on one model (a notebook cell run again, Keras's
# own tests) pays for one (20-130 ms), not one a call.
_ESTIMATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Whether this process took a compiled estimate yet (`compiled_estimate`'s
# `first`).
_TAKEN: list[bool] = []


def train_seconds_per_sample(
    model: Any, x: Any, y: Any, data: DataFacts
) -> float | None:
    """Seconds per sample of a training step, estimated as TRAIN_PER_FORWARD
    eager forward passes of `model` on synthetic inputs; None when the model
    cannot be called on them (a builder, a model whose `call` needs what
    `train_step` feeds it): then nothing is skipped for want of a figure.
    Taken once per process for a model, its precision and its inputs'
    shapes.

    Nothing the pass changes stays: the model's non-trainable variables
    (statistics, seed generators), Keras's global seed generator, Python's
    and NumPy's random state and the dtype policy are put back.
    """
    if not is_trainer(model) or not model.built:
        return None
    key = _input_key(model, x, data)
    try:
        seen = _ESTIMATES.setdefault(model, {})
    except TypeError:  # not weakly referable: measured each time
        seen = {}
    if key not in seen:
        seen[key] = _estimated(model, x, y, data)
    return seen[key]


def _input_key(model: Any, x: Any, data: DataFacts) -> tuple:
    """What the estimate depends on: the model's precision and the shapes
    of a sample (arrays), else the input object itself."""
    policy = getattr(getattr(model, "dtype_policy", None), "name", "")
    if data.kind != "arrays":
        return (policy, data.kind, id(x))
    leaves = keras.tree.flatten(data_facts.as_structure(x))
    return (
        policy,
        *(
            (tuple(getattr(a, "shape", ())[1:]), str(getattr(a, "dtype", "")))
            for a in leaves
        ),
    )


def _estimated(model: Any, x: Any, y: Any, data: DataFacts) -> float | None:
    try:
        inputs = _inputs(x, y, data)
    except Exception:  # no figure: the measurements decide
        return None
    held = list(model.non_trainable_variables)
    generator = keras_compat.existing_global_seed_generator()
    if generator is not None:
        held.append(generator.state)
    saved = [(v, value_of(v)) for v in {id(v): v for v in held}.values()]
    try:
        with preserved_state():
            compiled = engines.compiled_estimate(keras.backend.backend())
            if compiled is not None:
                try:
                    figure = compiled(
                        model, inputs, TRAIN_PER_FORWARD, first=not _TAKEN
                    )
                except Exception:  # not traceable as it is: the eager figure
                    figure = None
                _TAKEN.append(True)
                if figure is not None:
                    return figure
            _forward_seconds(model, inputs, FIRST_BATCH)  # eager's first-call setup
            first = _forward_seconds(model, inputs, FIRST_BATCH)
            batch = FIRST_BATCH
            if first * FORWARD_BATCH / FIRST_BATCH <= FORWARD_MAX_SECONDS:
                batch = FORWARD_BATCH
            seconds = min(_forward_seconds(model, inputs, batch) for _ in range(2))
    except Exception:  # as above
        return None
    finally:
        for variable, value in saved:
            variable.assign(value)
    return TRAIN_PER_FORWARD * seconds / batch


def _inputs(x: Any, y: Any, data: DataFacts) -> Callable[[int], Any]:
    """`batch -> model inputs`: the arrays' own first rows (repeated where
    there are fewer; no TensorFlow needed), else a synthetic batch shaped
    like the data's elements."""
    if data.kind == "arrays":
        arrays = data_facts.as_structure(x)

        def rows(batch: int) -> Any:
            def take(a: Any) -> Any:
                rows = np.asarray(a[:batch])  # only these rows, not all of `a`
                return np.take(rows, np.arange(batch) % len(rows), axis=0)

            return keras.tree.map_structure(take, arrays)

        return rows
    element = samples.element_structure(x, y, data)

    def synthetic(batch: int) -> Any:
        made = data_facts.as_structure(synthetic_batch(element, batch))
        return keras.utils.unpack_x_y_sample_weight(made)[0]

    return synthetic


def _forward_seconds(model: Any, inputs: Callable[[int], Any], batch: int) -> float:
    made = inputs(batch)
    start = time.perf_counter()
    model(made, training=False)
    return time.perf_counter() - start
