"""What `kerascale.diagnose` times on TensorFlow, on a copy of the model
and the data as a prepared `tf.data` pipeline:

- the input alone: the pipeline iterated, no model;
- the step alone: `fit` on one batch, cached and repeated;
- training: `fit` on the pipeline, as training runs it.

Rates are batches per second after `WARMUP_STEPS` steps. The JAX backend's
counterpart is `kerascale.measure.jax.timing`, with the same `rates`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import keras

from kerascale.measure.result import Rates
from kerascale.sense.data_facts import indexable_grain

if TYPE_CHECKING:
    from kerascale.apply.session import Prepared

WARMUP_STEPS = 3
# Prepared as a tf.data pipeline (arrays become one), which this module reads.
AS_DATASET = True
# What diagnose can read several times here, and what to pass instead.
READABLE = ("dataset", "arrays", "pydataset")
READABLE_HINT = (
    "arrays, a keras.utils.PyDataset, a tf.data.Dataset or a grain MapDataset "
    "for diagnose (it reads the data several times, and a generator or a grain "
    "IterDataset is used up as it is read)"
)


def rates(prepared: Prepared, steps: int) -> Rates:
    """The rates of `prepared` (`apply.session.Prepared`: its model a copy,
    its data a `tf.data.Dataset`); no loader on TensorFlow (its `loaded` is
    NaN: tf.data's own prefetch is the pipeline's)."""
    ds, copy, total = prepared.x, prepared.model, WARMUP_STEPS + steps
    if isinstance(ds, keras.utils.PyDataset) or indexable_grain(ds):
        ds = _cycled(ds)
    return Rates(
        input=_iterate(ds.repeat(), total),
        step=_train(copy, ds.take(1).cache().repeat(), total),
        plain=_train(copy, ds.repeat(), total),
        loaded=float("nan"),
    )


def _cycled(py: Any) -> Any:
    """A `PyDataset`'s or grain `MapDataset`'s batches (`py[i]`, `len(py)`)
    as a `tf.data` pipeline, round and round."""
    import itertools

    import numpy as np
    import tensorflow as tf

    first = py[0]
    first = tuple(first) if isinstance(first, (tuple, list)) else (first,)

    def spec(a: Any) -> Any:
        a = np.asarray(a)
        return tf.TensorSpec((None, *a.shape[1:]), tf.as_dtype(a.dtype))

    def batches() -> Any:
        for i in itertools.count():
            batch = py[i % len(py)]
            yield tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)

    signature = tuple(spec(a) for a in first)
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _iterate(ds: Any, total: int) -> float:
    it = iter(ds)
    for _ in range(WARMUP_STEPS):
        next(it)
    start = time.perf_counter()
    for _ in range(total - WARMUP_STEPS):
        next(it)
    return (total - WARMUP_STEPS) / (time.perf_counter() - start)


class _BatchClock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.ends: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def _train(model: keras.Model, ds: Any, total: int) -> float:
    clock = _BatchClock()
    model.fit(
        ds, epochs=1, steps_per_epoch=total, shuffle=False, verbose=0, callbacks=[clock]
    )
    timed = clock.ends[WARMUP_STEPS - 1 :]
    return (len(timed) - 1) / (timed[-1] - timed[0])
