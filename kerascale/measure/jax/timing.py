"""What `kerascale.diagnose` times on JAX, on the model it trains: the step
alone, training as plain `fit` runs it, and with the host loader.

Its design: docs/design/modules.md, `kerascale.measure.jax.timing`.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from kerascale.apply.jax.reader import DEPTH, ReadAhead
from kerascale.measure.result import Rates
from kerascale.sense.data_facts import indexable_grain

if TYPE_CHECKING:
    from kerascale.apply.session import Prepared

WARMUP_STEPS = 3
# Prepared as Keras's JAX fit takes it (arrays, a PyDataset, a tf.data
# pipeline), which `rates` reads several times: a generator can be read once.
AS_DATASET = False
READABLE = ("arrays", "pydataset", "dataset")
READABLE_HINT = (
    "arrays, a keras.utils.PyDataset, a tf.data.Dataset or a grain MapDataset "
    "for diagnose (it reads the data several times, and a generator or a grain "
    "IterDataset is used up as it is read)"
)


class _Clock(keras.callbacks.Callback):
    """When each step's logs are ready. Async-safe, so that Keras times its
    own loop, which dispatches steps ahead without waiting on their logs
    (a callback that is not would make it wait on each)."""

    async_safe = True

    def on_train_begin(self, logs=None):
        self.ends: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def rate(self) -> float:
        timed = sorted(self.ends)[WARMUP_STEPS - 1 :]  # callbacks run on a pool
        return (len(timed) - 1) / (timed[-1] - timed[0])


class _ReadingAhead(keras.callbacks.Callback):
    """Puts a `ReadAhead` in place of Keras's train function for one `fit`."""

    def on_train_begin(self, logs=None):
        self.ahead = ReadAhead(self.model.train_function, DEPTH)
        self.model.train_function = self.ahead

    def undo(self) -> None:
        ahead = getattr(self, "ahead", None)
        if ahead is not None:
            ahead.close()
            if self.model.train_function is ahead:
                self.model.train_function = ahead.function


def rates(prepared: Prepared, steps: int) -> Rates:
    """The four rates of `prepared` (`apply.session.Prepared`: the model it
    trains, the data as Keras's fit takes it, the plan's batch)."""
    batch = prepared.plan.step_batch_size
    return measure(prepared.model, prepared.x, prepared.y, batch, steps)


def measure(model: keras.Model, x: Any, y: Any, batch_size: int, steps: int) -> Rates:
    """The four rates for `model` (built and compiled) on `x`, `y` in
    batches of `batch_size` (arrays) or as they come (a `PyDataset`)."""
    total = WARMUP_STEPS + steps
    first = first_batch(x, y, batch_size)

    def again():
        while True:
            yield first

    step = _rate(model, (again(),), {"steps_per_epoch": total, "shuffle": False})
    kwargs: dict[str, Any] = {}
    if isinstance(x, keras.utils.PyDataset) or indexable_grain(x):
        args, batches = (x,), len(x)
        kwargs["shuffle"] = False  # they order themselves (Keras warns)
    elif _is_dataset(x):
        # Read again and again, from a copy with shuffles of its own.
        from kerascale.sense.data_facts import peekable

        args, batches = (peekable(x).repeat(),), total
    else:
        args, kwargs["batch_size"] = (x, y), batch_size
        batches = math.ceil(_samples(x) / batch_size)
    if batches >= total:
        kwargs["steps_per_epoch"] = total
    else:
        kwargs["epochs"] = math.ceil(total / batches)
    plain = _rate(model, args, kwargs)
    reading = _ReadingAhead()
    try:
        loaded = _rate(model, args, kwargs, reading)
    finally:
        reading.undo()
    items, read_seconds = reading.ahead.counts()
    return Rates(
        input=items / read_seconds if read_seconds > 0 else math.inf,
        step=step,
        plain=plain,
        loaded=loaded,
    )


def _rate(model: keras.Model, args: tuple, kwargs: dict, *extra: Any) -> float:
    clock = _Clock()
    model.fit(*args, verbose=0, callbacks=[clock, *extra], **kwargs)
    return clock.rate()


def first_batch(x: Any, y: Any, batch_size: int) -> Any:
    """The first batch, as NumPy: of arrays, their first `batch_size` rows;
    of a `PyDataset` or a grain `MapDataset`, its batch 0."""
    if isinstance(x, keras.utils.PyDataset) or indexable_grain(x):
        batch = x[0]
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if _is_dataset(x):
        from kerascale.sense.data_facts import peekable

        batch = next(iter(peekable(x).take(1)))
        batch = keras.tree.map_structure(np.asarray, batch)
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    data = (x,) if y is None else (x, y)
    return keras.tree.map_structure(lambda a: np.asarray(a[:batch_size]), data)


def _is_dataset(x: Any) -> bool:
    from kerascale.sense.data_facts import is_dataset

    return is_dataset(x)


def _samples(x: Any) -> int:
    return len(keras.tree.flatten(x)[0])
