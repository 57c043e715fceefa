"""The memory a batch search's probes work against: in child processes and
in this process, on a CPU (a share of what is available, or `memory_limit`),
a TPU, or GPUs (what their allocators get, from NVML)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kerascale._units import format_bytes
from kerascale.plan.reasons import Reason
from kerascale.sense import gpu_memory
from kerascale.sense.memory import available_bytes

if TYPE_CHECKING:
    from kerascale.measure.request import SearchOptions
    from kerascale.plan.plan import Plan
    from kerascale.sense.hardware import Hardware

# On CPU without memory_limit, probes may use this share of available memory.
CPU_DEFAULT_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class Memory:
    """The memory a search works against.

    Attributes:
        enforce: What a probe may use (`ProbeSpec.memory_limit`); None where
            the device itself decides (a GPU's allocator).
        predict: The memory model's limit for predictions (the search's
            `limit_bytes`); None to search by doubling and bisection alone.
        why: The limit and where it comes from, for the result's reasons.
        measured: Which memory the probes measured, for the plan.
    """

    enforce: int | None
    predict: int | None
    why: Reason
    measured: str


def memories(hw: Hardware, plan: Plan, options: SearchOptions) -> tuple[Memory, Memory]:
    """The memory probes have in child processes, and in this process (one
    reading of the device: the search may fall back from one to the other)."""
    if hw.accelerator == "gpu":
        return _gpu_memories(hw, plan, options)
    kind = "resident memory (RSS)" if hw.accelerator == "cpu" else "TPU memory"
    measured = {True: f"{kind} of child processes", False: f"{kind} of this process"}
    if options.memory_limit:
        limit, why = options.memory_limit, Reason("limit.passed")
    elif hw.accelerator == "tpu":
        limit, why = None, Reason("limit.tpu_unknown")
    elif (avail := available_bytes()) is None:
        limit, why = None, Reason("limit.unknown")
    else:
        limit = int(avail * CPU_DEFAULT_SHARE)
        why = Reason(
            "limit.cpu_share", share=CPU_DEFAULT_SHARE, available=format_bytes(avail)
        )
    return (
        Memory(limit, limit, why, measured[True]),
        Memory(limit, limit, why, measured[False]),
    )


def _gpu_memories(
    hw: Hardware, plan: Plan, options: SearchOptions
) -> tuple[Memory, Memory]:
    """On GPUs, probes in this process measure the allocator training will
    use (see `_isolation`); a child's allocator gets only what is free."""
    children = "GPU memory of child processes' TensorFlow allocators"
    here = "GPU memory of this process's TensorFlow allocator"
    if options.memory_limit:
        limit, why = options.memory_limit, Reason("limit.passed_per_gpu")
        return Memory(limit, limit, why, children), Memory(limit, limit, why, here)
    indices = [int(d.rsplit(":", 1)[1]) for d in plan.devices if "gpu" in d.lower()]
    by_index = {g.index: g for g in hw.gpus}
    ccs = [
        (by_index[i].compute_capability or (None,))[0] if i in by_index else None
        for i in indices
    ]
    now = gpu_memory.read(indices, ccs) if indices else None
    if not now:
        why = Reason("limit.gpu_unknown")
        return Memory(None, None, why, children), Memory(None, None, why, here)
    c = min(now, key=lambda g: g.for_new_process)
    why = Reason(
        "limit.gpu_child",
        size=format_bytes(c.for_new_process),
        index=c.index,
        free=format_bytes(c.free),
        total=format_bytes(c.total),
        held=c.for_new_process < c.total // 4,
    )
    m = min(now, key=lambda g: g.allocator_size)
    why_here = Reason(
        "limit.gpu_here",
        size=format_bytes(m.allocator_size),
        index=m.index,
        total=format_bytes(m.total),
        others=format_bytes(m.others) if m.others else "",
        in_use=format_bytes(m.in_use),
    )
    return (
        Memory(None, c.for_new_process, why, children),
        Memory(None, m.allocator_size, why_here, here),
    )
