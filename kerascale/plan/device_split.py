"""Whether data-parallel over one process's JAX devices, which kerascale
chose on its own, holds for this data: the devices must divide each batch,
and a second device must have a share worth splitting for. Pure.
"""

from __future__ import annotations

from typing import Protocol

from kerascale.plan.options import Options
from kerascale.sense import backend as backend_lib
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware

# Data-parallel chosen on its own needs a data set of at least this many
# samples per device: below it a device idles, the all-reduce costs more than
# the share saves, and a sum over a few samples is split for nothing (Keras's
# SwapEMAWeights test: 10 samples over 2 devices, whose validation metric
# then differed from `evaluate`'s in the last digit).
MIN_SHARE = 8


class Where(Protocol):
    """What a split reads of where the model trains (`rules`' placement)."""

    @property
    def strategy(self) -> str: ...

    @property
    def replicas(self) -> int: ...


def chosen_split(hardware: Hardware, options: Options, where: Where) -> bool:
    """Whether `where` is data-parallel over one process's JAX devices that
    kerascale chose on its own (across processes each would train alone)."""
    return (
        backend_lib.traits(hardware.backend).even_batches
        and options.strategy == "auto"
        and where.strategy == "data_parallel"
        and where.replicas > 1
        and not (hardware.cluster is not None and hardware.cluster.is_multi_worker)
    )


def small_share(
    hardware: Hardware, options: Options, data: DataFacts, where: Where
) -> str:
    """Why data-parallel that kerascale chose on its own would not pay, or
    "": arrays whose samples leave each device fewer than MIN_SHARE a step,
    all of them. (A batch you chose smaller stays split: a step of 16 over 4
    devices of 80 MiB fitted them, and did not fit one.)"""
    if not chosen_split(hardware, options, where):
        return ""
    n = data.num_samples if data.kind == "arrays" else None
    if n and n < MIN_SHARE * where.replicas:
        return (
            f"{n} samples leave each of the {where.replicas} devices fewer "
            f"than {MIN_SHARE} a step"
        )
    return ""


def uneven(
    hardware: Hardware,
    options: Options,
    data: DataFacts,
    where: Where,
    default_batch: int,
) -> str:
    """Why data-parallel training that kerascale chose on its own over JAX's
    devices would fail where plain `fit` on one device trains, or "": a
    batch the devices do not divide, or data that cannot be split (sparse,
    ragged). Across processes nothing is dropped (each would train alone)."""
    if not chosen_split(hardware, options, where):
        return ""
    if data.unsplittable:
        return f"{data.unsplittable}, which JAX cannot split over devices"
    if data.kind == "other" and not data.splittable:
        return (
            "kerascale cannot cut each batch of your input into even shares as "
            "it is read"
        )
    batch = data.batch_size if data.batched else None
    if data.kind != "pydataset" and isinstance(options.batch_size, int):
        batch = options.batch_size
    if batch and batch % where.replicas:
        return (
            f"your batch of {batch} does not split evenly over the "
            f"{where.replicas} devices"
        )
    n = data.num_samples if data.kind == "arrays" else None
    if n:
        # Each epoch's last batch keeps what the devices divide: worth it
        # where that leaves out a sample in a hundred or fewer.
        step = batch or default_batch * where.replicas
        dropped = (n % step) % where.replicas
        if dropped * 100 > n:
            return (
                f"your {n} samples end in a batch that does not split evenly "
                f"over the {where.replicas} devices, and leaving out "
                f"{dropped} of them each epoch would change training"
            )
    return ""
