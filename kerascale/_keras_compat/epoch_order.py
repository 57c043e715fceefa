"""The epoch counter that seeds Keras's shuffle, from Keras 3.16.

Up to Keras 3.15 an array or `PyDataset` input is shuffled from NumPy's
and Python's global random state; `FaultTolerantBackup` puts that state
back to replay an epoch's order. From Keras 3.16 (keras-team/keras#23046,
in keras-nightly 3.16.0.dev2026102704) the shuffle is seeded from the data
adapter's own epoch counter: `DataAdapter._epoch`, 0 in every new adapter,
one more at each `on_epoch_end` (which `EpochIterator.reset` calls once at
`fit`'s start). On JAX and NumPy, `np.random.default_rng(_epoch)` for
arrays and `random.Random(_epoch)` for a `PyDataset`, read when the epoch's
iterator gives its first batch; on TensorFlow a stateless shuffle seeded
`[_epoch, 0]`. A rerun's `fit(initial_epoch=k)` makes a new adapter, which
would replay epoch 0's order at epoch k, so the counter is recorded with a
checkpoint and put back before the resumed iterator reads it.

Keras exports neither the adapter nor its counter. The adapter is the
`data_adapter` of the `EpochIterator` that Keras's backend `fit` holds in
its local `epoch_iterator`, found from a callback's `on_train_begin` by
walking up the stack (`fit_epoch_iterator`). `tests/test_compat.py` pins
both: the local's name in this Keras's `fit`, and that the counter (where
this Keras has one) orders the shuffle.

A `PyDataset` with `workers` is read by Keras's enqueuer, which draws the
epoch's order on its own thread in the adapter's `on_epoch_begin` (so the
order's state is put back at the callback's, which Keras calls first), and
which keeps the batches it had read ahead when an epoch ends for the next
(its `ready_queue`, keras-team/keras#20123). On JAX, Keras's `fit` reads a
batch to build the model before its first epoch (keras-team/keras#20394),
so every epoch then begins with batches of the one before it, which no
checkpoint holds: `carried_batches` counts them, for the order check to
name the cause. `tests_common/resume_order.py` pins both on each Keras.
"""

from __future__ import annotations

import sys
from typing import Any

UPSTREAM = "keras-team/keras#23046"
CARRIED_UPSTREAM = "keras-team/keras#20123, keras-team/keras#20394"
LOCAL = "epoch_iterator"  # the name of the EpochIterator in Keras's fit


def fit_epoch_iterator() -> Any | None:
    """The `EpochIterator` of the Keras `fit` running below the caller on
    the stack (a callback's hook), or None where none is found."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and LOCAL in frame.f_code.co_varnames:
            found = frame.f_locals.get(LOCAL)
            if hasattr(found, "data_adapter"):
                return found
        frame = frame.f_back
    return None


def adapter_of(epoch_iterator: Any) -> Any | None:
    return getattr(epoch_iterator, "data_adapter", None)


# The attribute each of Keras's data adapters keeps its input in (Keras
# 3.15.1 and 3.16): what a checkpoint's input fingerprint reads
# (`callbacks._input_fingerprint`). Keras exports no accessor.
INPUTS = {
    "ArrayDataAdapter": ("arrays", "_inputs"),
    "TFDatasetAdapter": ("tf.data", "_dataset"),
    "PyDatasetAdapter": ("pydataset", "py_dataset"),
    "GrainDatasetAdapter": ("grain", "_dataset"),
    "GeneratorDataAdapter": ("generator", "generator"),
}


def input_of(adapter: Any) -> tuple[str | None, Any]:
    """(the kind, the input) that Keras's `adapter` reads: "arrays" (its
    packed (x, y, sample_weight)), "tf.data", "pydataset", "grain" or
    "generator"; (None, None) for another adapter or one that keeps its
    input elsewhere."""
    kind, name = INPUTS.get(type(adapter).__name__, (None, None))
    if kind is None or not hasattr(adapter, name):
        return None, None
    return kind, getattr(adapter, name)


def counter(adapter: Any) -> int | None:
    """The adapter's epoch counter, or None where this Keras has none (up to
    3.15: the order is the global random state's)."""
    value = getattr(adapter, "_epoch", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def set_counter(adapter: Any, value: int) -> bool:
    """Sets the counter; False where this adapter has none."""
    if counter(adapter) is None:
        return False
    adapter._epoch = int(value)
    return True


def carried_batches(adapter: Any) -> int:
    """How many batches Keras's enqueuer (a `PyDataset` with `workers`)
    holds from before the epoch that begins; 0 where there is no enqueuer."""
    ready = getattr(getattr(adapter, "enqueuer", None), "ready_queue", None)
    try:
        return int(ready.qsize())
    except (AttributeError, TypeError, ValueError):
        return 0


def keras_fit_holds_the_epoch_iterator() -> bool:
    """Whether this Keras's backend `fit` still names its `EpochIterator`
    `epoch_iterator` (what `fit_epoch_iterator` finds): the test that fails
    when upstream renames it."""
    import keras

    # keras.Model's fit is the backend trainer's (JAXTrainer or
    # TensorFlowTrainer up to 3.15, each backend's Trainer from 3.16).
    fit = keras.Model.fit
    code = getattr(fit, "__wrapped__", fit).__code__
    return LOCAL in code.co_varnames and "keras" in code.co_filename
