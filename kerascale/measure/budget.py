"""What kerascale's own measurements may cost: a share of the run they tune.

The batch search's ladder (CPU) and the trials each pay for themselves only
on a run long enough: they run when the expected run is at least
1 / BUDGET_SHARE (10x) what they would cost, and are otherwise skipped with
the reason. Before anything is measured, the run's length comes from a first
estimate of a training step: an eager forward pass of the user's own model on
a synthetic batch (`train_seconds_per_sample`).

On 2 cores (TF 2.21), the estimate against `model.fit`'s trained samples at
batch 32: the quickstart CNN 0.30 ms against 0.08-0.12 ms, the reference
CNN of benchmarks/end_to_end.py 0.50 against 0.31 ms, its BatchNorm-heavy
one 2.1 against 1.5-1.9 ms. A training step (a forward and a backward pass)
is taken as 2 eager forward passes: an overestimate on small models, where
eager dispatch dominates, so that the error makes a run look longer (the
search runs), not shorter. The estimate itself took 20-130 ms.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascale._state import preserved_state, value_of
from kerascale.apply import keras_compat
from kerascale.measure.probe import MIN_TIMED_SECONDS, synthetic_batch
from kerascale.measure.search import LADDER_CHUNK
from kerascale.sense import data_facts, samples
from kerascale.sense.model_facts import is_trainer

BUDGET_SHARE = 0.10  # the measurements may cost this share of the expected run
TRAIN_PER_FORWARD = 2.0  # a training step, in forward passes
FORWARD_BATCH = 32  # timed, when a smaller first pass predicts it is quick
FIRST_BATCH = 4
FORWARD_MAX_SECONDS = 0.25  # the FORWARD_BATCH pass only under this
# The batch search's ladder in child processes (2 cores, the quickstart: a
# child's start, TensorFlow's import and the first trace 2.5-3 s; each further
# rung of the same child 0.5 s beyond its timed steps).
CHILD_START_SECONDS = 2.5
RUNG_SECONDS = 0.5


class RunBudget:
    """The run kerascale's measurements are weighed against: `epochs` of
    the training data (`data`, or `steps_per_epoch` steps), at a first speed
    that `estimate` (seconds per trained sample, or None) gives once, when a
    measurement first needs it."""

    def __init__(
        self,
        data: Any,
        epochs: int,
        steps_per_epoch: Any,
        estimate: Callable[[], float | None],
    ):
        self.data, self.epochs, self.steps_per_epoch = data, epochs, steps_per_epoch
        self._estimate = estimate

    def samples(self, plan: Any) -> int | None:
        """The samples the run trains under `plan`; None when unknown."""
        steps = self.steps_per_epoch
        if isinstance(steps, int) and steps > 0:
            return self.epochs * steps * plan.global_batch_size
        if self.data.num_samples:
            return self.epochs * self.data.num_samples
        return None

    @functools.cached_property
    def per_sample(self) -> float | None:
        return self._estimate()

    def speed(self) -> float | None:
        """The first estimate's samples/s, or None."""
        return 1 / self.per_sample if self.per_sample else None

    def refuse_search(self, plan: Any, rungs: list[int], steps: int) -> str | None:
        """Why the ladder `rungs` is not worth probing for a run under `plan`
        (its batch is what the run would train at without the search), or
        None: also when the run's length or a first step time is unknown
        (then it is probed, as a run that may be long)."""
        samples = self.samples(plan)
        if samples is None or self.per_sample is None:
            return None
        cost = search_seconds(rungs, self.per_sample, steps)
        return over_budget(cost, samples * self.per_sample, "the search")


def train_seconds_per_sample(model: Any, x: Any, y: Any, data: Any) -> float | None:
    """Seconds per sample of a training step, estimated as TRAIN_PER_FORWARD
    eager forward passes of `model` on synthetic inputs; None when the model
    cannot be called on them (a builder, a model whose `call` needs what
    `train_step` feeds it): then nothing is skipped for want of a figure.

    Nothing the pass changes stays: the model's non-trainable variables
    (statistics, seed generators), Keras's global seed generator, Python's
    and NumPy's random state and the dtype policy are put back.
    """
    if not is_trainer(model) or not model.built:
        return None
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


def _inputs(x: Any, y: Any, data: Any) -> Callable[[int], Any]:
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


def search_seconds(rungs: list[int], per_sample: float, steps: int) -> float:
    """The ladder's expected cost: a child per LADDER_CHUNK rungs, each
    rung tracing, timing `steps` steps (at least MIN_TIMED_SECONDS) and
    validating."""
    children = math.ceil(len(rungs) / LADDER_CHUNK)
    each = sum(
        RUNG_SECONDS + max(MIN_TIMED_SECONDS, steps * b * per_sample) + b * per_sample
        for b in rungs
    )
    return children * CHILD_START_SECONDS + each


def over_budget(cost: float, run_seconds: float, what: str = "they") -> str | None:
    """Why a measurement costing `cost` seconds is not worth it on a run of
    `run_seconds`, or None when it is; `what` names it."""
    if cost <= BUDGET_SHARE * run_seconds:
        return None
    return (
        f"the run (about {_seconds(run_seconds)}) is shorter than "
        f"{1 / BUDGET_SHARE:.0f}x what {what} would take (about {_seconds(cost)})"
    )


def _seconds(s: float) -> str:
    return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
