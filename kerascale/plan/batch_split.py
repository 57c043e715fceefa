"""How each global batch is split where the devices must divide it evenly
(JAX: `sense.backend.Traits.even_batches`). Pure: `apply.jax.even_batches` carries
it out.

Arrays: the last batch of an epoch keeps the part the devices divide (at
most `replicas - 1` samples are left out each epoch, said once in the
plan). A `PyDataset`, a generator or a grain dataset: each batch is cut as it
is read (one warning if one is cut). Anything else goes to Keras as it is.
"""

from __future__ import annotations

from typing import Any

from kerascale.sense.data_facts import DataFacts


def changes(
    data: DataFacts, step_batch: int, replicas: int, processes: int = 1
) -> tuple[dict[str, Any], list[str]]:
    """(data changes, as `DataChanges` fields; warnings) for `data` at
    global batch `step_batch` over `replicas` devices of `processes` JAX
    processes."""
    if replicas <= 1:
        return {}, []
    split = {"by_process": True} if processes > 1 and _shared(data) else {}
    if processes > 1 and not _shared(data) and data.kind != "dataset":
        return {}, [
            f"kerascale cannot give each of the {processes} JAX processes its "
            f"share of a {data.kind} input it cannot cut as it reads: each "
            "process trains on the batches its own input gives (Keras joins "
            "them into one global batch). Pass NumPy arrays, a PyDataset, a "
            "generator or a grain dataset to have it split."
        ]
    if data.kind == "arrays" and data.num_samples:
        last = data.num_samples % step_batch
        dropped = last % replicas
        if not dropped:
            return split, []
        return {**split, "left_out": dropped}, [
            f"Your {data.num_samples} samples end in a batch of {last}, which "
            f"JAX cannot split evenly over the {replicas} devices (plain "
            f"model.fit under this distribution fails on it): kerascale leaves "
            f"out the last {dropped} sample(s) of each epoch. To keep them, pass "
            f"a batch_size whose last batch is a multiple of {replicas}, or a "
            'sample count that is; strategy="default" trains on one device.'
        ]
    if data.kind in ("pydataset", "other") and data.splittable:
        return {**split, "cut_as_read": True}, []
    return split, []


def _shared(data: DataFacts) -> bool:
    """Whether kerascale gives each process its share of `data` (a
    tf.data.Dataset, Keras shards itself)."""
    return data.kind == "arrays" or data.splittable
