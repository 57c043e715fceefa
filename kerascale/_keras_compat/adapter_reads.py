"""The batches a `PyDataset` gives, seen where Keras reads it in Python.

On TensorFlow, Keras reads a `PyDataset` through `tf.data.Dataset.
from_generator` over its adapter's Python generator (`PyDatasetAdapter.
_get_iterator`, Keras 3.15.1 and 3.16): the training step reads the batches
inside a `tf.function`, where no callback sees them. A resume's order check
(issue 56, `callbacks._input_order`) needs a digest of the last batch the
step trained, so the adapter's four generator methods are wrapped on the
instance: `_get_iterator` looks each up on `self` at the start of every
epoch's generator, so the wrapper sees every batch in the order the step
trains it (`from_generator` keeps its generator's order; the enqueuer puts
its workers' batches back in order). No upstream issue: Keras exports no
per-batch hook for a data adapter (searched 2026-12-02).

`tests_common/resume_order.py` pins it on both Keras versions the suite
runs: this Keras's adapter reads a `PyDataset` through the four methods
(`test_keras_reads_a_pydataset_through_the_generators_kerascale_follows`),
and on TensorFlow a resume on changed data is said only through them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GENERATORS = (
    "_finite_generator",
    "_infinite_generator",
    "_finite_enqueuer_generator",
    "_infinite_enqueuer_generator",
)


def follow(
    adapter: Any, started: Callable[[], None], read: Callable[[Any], None]
) -> Callable[[], None] | None:
    """Calls `started()` when one of the adapter's generators starts (an
    epoch's, or the one of a run with `steps_per_epoch`) and `read(batch)`
    for each batch it gives, before the batch goes on. Returns the undo, or
    None where `adapter` is not a `PyDataset`'s with these generators."""
    if type(adapter).__name__ != "PyDatasetAdapter":
        return None
    if not all(callable(getattr(adapter, name, None)) for name in GENERATORS):
        return None
    for name in GENERATORS:
        setattr(adapter, name, _wrapped(getattr(adapter, name), started, read))

    def undo() -> None:
        for name in GENERATORS:
            vars(adapter).pop(name, None)

    return undo


def _wrapped(real: Callable[[], Any], started, read) -> Callable[[], Any]:
    def generator():
        started()
        for batch in real():
            read(batch)
            yield batch

    return generator
