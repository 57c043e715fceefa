"""The memory one JAX training step may take on one device: what is free
there (or on CPU devices, in this process) beyond what it holds now, less
what the step's state and gradient accumulators need. Each figure comes
with its reason (the `limit.*` codes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from kerascale._units import format_bytes
from kerascale.apply import model as model_lib
from kerascale.measure import request as request_lib
from kerascale.measure.probe_memory import CPU_DEFAULT_SHARE
from kerascale.plan.reasons import Reason
from kerascale.sense import memory

if TYPE_CHECKING:
    from kerascale.measure.request import SearchOptions
    from kerascale.sense.hardware import Hardware


class StepBytes(Protocol):
    """What this module reads of a compiled step (`compiled.StepMemory`):
    named here, not imported, so that the device's free memory stands beside
    the compiled search rather than above it."""

    state_bytes: int
    accumulator_bytes: int
    replicas: int


def for_step(
    hw: Hardware, options: SearchOptions, step: StepBytes
) -> tuple[int, Reason]:
    """`free_bytes`, or with `device_memory` what a device has beyond the
    state laid out on it."""
    if not options.device_memory:
        return free_bytes(hw, options)
    why = Reason(
        "limit.device_memory",
        memory=format_bytes(options.device_memory),
        state=format_bytes(step.state_bytes),
    )
    return options.device_memory - step.state_bytes, why


def free_bytes(hw: Hardware, options: SearchOptions) -> tuple[int, Reason]:
    """The bytes one step may take on one device (on a CPU, in this
    process), beyond what is held there now, and where the figure comes from.

    Raises:
        SearchUnavailable: When the device reports no memory figures.
    """
    import jax

    if hw.accelerator in ("gpu", "tpu"):
        try:
            stats = jax.local_devices()[0].memory_stats()
        except Exception:
            stats = None
        if not stats or not stats.get("bytes_limit"):
            raise request_lib.SearchUnavailable(
                "the device reports no memory figures (memory_stats) to search under"
            )
        limit, passed = int(stats["bytes_limit"]), False
        if options.memory_limit and options.memory_limit < limit:
            limit, passed = options.memory_limit, True
        used = int(stats.get("bytes_in_use", 0))
        why = Reason(
            "limit.device_free",
            passed=passed,
            limit=format_bytes(limit),
            used=format_bytes(used),
        )
        return limit - used, why
    if not options.memory_limit:
        available = memory.available_bytes()
        if available is None:
            raise request_lib.SearchUnavailable("the memory available here is unknown")
        limit = int(available * CPU_DEFAULT_SHARE)
        # The memory available is what this process leaves: nothing to take.
        share, spelled = CPU_DEFAULT_SHARE, format_bytes(limit)
        return limit, Reason("limit.cpu_available", share=share, limit=spelled)
    limit, resident = options.memory_limit, memory.resident_bytes() or 0
    why = Reason(
        "limit.passed_less_resident",
        limit=format_bytes(limit),
        resident=format_bytes(resident),
    )
    return limit - resident, why


def less_accumulators(
    free: int,
    why: Reason,
    step: StepBytes,
    model: Any,
    steps: int | None,
    host: bool,
) -> tuple[int, Reason]:
    """`free` less the gradient accumulators that `steps` of accumulation
    add (none where the optimizer already holds them)."""
    optimizer = model_lib.core_optimizer(model.optimizer)
    if not steps or steps < 2 or getattr(optimizer, "gradient_accumulation_steps", 0):
        return free, why
    held = step.accumulator_bytes * (step.replicas if host else 1)
    less = Reason("limit.less_accumulators", why=why, held=format_bytes(held))
    return free - held, less
