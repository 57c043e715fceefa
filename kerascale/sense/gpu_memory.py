"""GPU memory as TensorFlow's allocator sees it, read when a search starts.

Its design: docs/design/modules.md, `kerascale.sense.gpu_memory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

from kerascale.sense.nvml import visible_nvml_handles

MiB = 1 << 20


def min_system_memory(available: int, cc_major: int | None) -> int:
    """TensorFlow's reserve below a GPU's free memory (`MinSystemMemory` in
    gpu_device.cc), or `TF_DEVICE_MIN_SYS_MEMORY_IN_MB` where set."""
    forced = os.environ.get("TF_DEVICE_MIN_SYS_MEMORY_IN_MB", "").strip()
    if forced.isdigit():
        return int(forced) * MiB
    if available < (1 << 31):
        return 225 * MiB
    major = cc_major or 0
    if major <= 6:
        return 500 * MiB
    if major == 7:
        return 1050 * MiB
    if major == 8:
        return 1536 * MiB
    return 1800 * MiB


@dataclasses.dataclass(frozen=True)
class GPUMemory:
    """One GPU's memory now.

    Attributes:
        index: TensorFlow's index of the GPU (GPU:index).
        total: The device's memory (NVML).
        free: Free memory now, all processes counted (NVML).
        others: Memory other processes hold, where NVML lists them; 0 when
            it cannot tell.
        in_use: Bytes this process's tensors hold (TensorFlow's allocator).
        cc_major: The compute capability's major version, if known.
    """

    index: int
    total: int
    free: int
    others: int
    in_use: int
    cc_major: int | None = None

    @property
    def allocator_size(self) -> int:
        """About what this process's allocator holds: the device less other
        processes and TensorFlow's reserve. An estimate (the exact size was
        fixed when TensorFlow started and is not exposed, and this process's
        CUDA context is not counted): it guides predictions only, since
        running out of memory is what decides."""
        room = self.total - self.others
        return max(0, room - min_system_memory(room, self.cc_major))

    @property
    def for_new_process(self) -> int:
        """About what a new process's allocator would get: the memory free
        now less TensorFlow's reserve (less again that process's own CUDA
        context, which is not counted)."""
        return max(0, self.free - min_system_memory(self.free, self.cc_major))


def read(indices: list[int], ccs: list[int | None]) -> list[GPUMemory] | None:
    """The memory of TensorFlow's GPUs `indices` (with their compute
    capability majors `ccs`), or None where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, ...
        return None
    try:
        handles = visible_nvml_handles(pynvml)
        return [
            _one(pynvml, handles[i], i, cc) for i, cc in zip(indices, ccs, strict=True)
        ]
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _one(pynvml: Any, handle: Any, index: int, cc: int | None) -> GPUMemory:
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    others = 0
    with contextlib.suppress(Exception):  # not every driver lists processes
        others = sum(
            int(p.usedGpuMemory or 0)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid != os.getpid()
        )
    total, free = int(info.total), int(info.free)
    return GPUMemory(
        index=index,
        total=total,
        free=free,
        others=others,
        in_use=_in_use(index),
        cc_major=cc,
    )


def _in_use(index: int) -> int:
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info(f"GPU:{index}")["current"])
    except (ValueError, RuntimeError):  # no such device here
        return 0
