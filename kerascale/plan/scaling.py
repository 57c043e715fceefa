"""The step time at N workers for data parallelism, predicted from one
worker's measured step and the bytes its gradients all-reduce. Pure.

Its design: docs/design/modules.md, `kerascale.plan.scaling`.
"""

from __future__ import annotations

import dataclasses

# bytes/s and s per hop, per link kind: nominal rates of typical links.
INTERCONNECTS = {
    # NVLink 4 (H100 SXM): 450 GB/s each way per GPU; a ring uses one direction.
    "gpu": (450e9, 5e-6),
    # TPU v4/v5 ICI: ~100 GB/s per link.
    "tpu": (100e9, 5e-6),
    # Between machines: 100 Gb/s Ethernet or InfiniBand.
    "network": (12.5e9, 20e-6),
    # CPU devices of one process: memory copies (a few GB/s on 2 cores).
    "cpu": (5e9, 20e-6),
}


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A predicted step time at `workers` workers.

    Attributes:
        workers: How many data-parallel workers.
        step_seconds: One optimizer update's time (with accumulation, all
            its micro-steps and one all-reduce).
        allreduce_seconds: The all-reduce's part of it.
        samples_per_second: The global throughput it implies.
    """

    workers: int
    step_seconds: float
    allreduce_seconds: float
    samples_per_second: float


def allreduce_seconds(
    gradient_bytes: int, workers: int, bandwidth: float, latency: float
) -> float:
    """A ring all-reduce of `gradient_bytes` over `workers`."""
    if workers < 2:
        return 0.0
    hops = 2 * (workers - 1)
    return hops / workers * gradient_bytes / bandwidth + hops * latency


def estimate(
    step_seconds: float,
    batch_per_worker: int,
    gradient_bytes: int,
    workers: int,
    *,
    kind: str = "network",
    bandwidth: float | None = None,
    latency: float | None = None,
    accumulation: int = 1,
    shared_compute: bool = False,
) -> Estimate:
    """The step at `workers` workers, from one worker's measured
    `step_seconds` at `batch_per_worker` samples.

    Args:
        step_seconds: One worker's measured training step (no all-reduce).
        batch_per_worker: The samples of that step (each worker's share).
        gradient_bytes: The bytes of the gradients (the trainable
            variables', in their dtype).
        workers: How many workers.
        kind: The link between them (`INTERCONNECTS`).
        bandwidth: Bytes/s per link, instead of `kind`'s.
        latency: Seconds per hop, instead of `kind`'s.
        accumulation: Micro-batches per update (the all-reduce runs once).
        shared_compute: The workers share one machine's cores.
    """
    default_bandwidth, default_latency = INTERCONNECTS[kind]
    reduce = allreduce_seconds(
        gradient_bytes,
        workers,
        bandwidth or default_bandwidth,
        default_latency if latency is None else latency,
    )
    compute = step_seconds * accumulation * (workers if shared_compute else 1)
    total = compute + reduce
    samples = batch_per_worker * workers * accumulation
    return Estimate(workers, total, reduce, samples / total)


def table(
    step_seconds: float,
    batch_per_worker: int,
    gradient_bytes: int,
    workers: list[int],
    **kwargs: object,
) -> list[Estimate]:
    """`estimate` for each count of `workers`."""
    return [
        estimate(step_seconds, batch_per_worker, gradient_bytes, n, **kwargs)
        for n in workers
    ]
