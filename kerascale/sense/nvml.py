"""What NVML (the `nvidia-ml-py` package) says about the GPUs here: their
memory, names and compute capabilities, in the order the backend numbers
them (`CUDA_VISIBLE_DEVICES`, which TensorFlow and JAX honour and NVML
ignores). Never raises for a missing driver or package."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any


def visible_nvml_indices(count: int) -> list[int | str]:
    """Maps TensorFlow's GPU order to NVML indices (or UUIDs) via
    CUDA_VISIBLE_DEVICES, which TensorFlow honours and NVML ignores."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(range(count))
    out: list[int | str] = []
    for item in visible.split(","):
        item = item.strip()
        out.append(int(item) if item.isdigit() else item)
    return out


def visible_nvml_handles(pynvml: Any) -> list[Any]:
    """NVML handles of the GPUs TensorFlow sees, in TensorFlow's order (NVML
    already initialised)."""
    count = pynvml.nvmlDeviceGetCount()
    handles = []
    for key in visible_nvml_indices(count):
        if isinstance(key, int):
            if key < count:
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(key))
        else:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(key))
    return handles


def nvml_gpus(notes: list[str]) -> list[dict[str, Any]] | None:
    """Every GPU NVML sees as {index, uuid, name, memory_total, cc}; None
    when NVML cannot be used."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        notes.append(f"NVML unavailable: {e}")
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out.append(
                {
                    "index": i,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "cc": tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                }
            )
        return out
    except Exception as e:
        notes.append(f"NVML query failed: {e}")
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def enrich(
    gpu: Any,
    nvml_gpus: list[dict[str, Any]],
    notes: list[str],
    *,
    keep_memory: bool = False,
) -> Any:
    """`gpu` (a `GPUInfo`) with NVML's name, memory and compute capability
    (`keep_memory`: the memory it already has, where it has one)."""
    order = visible_nvml_indices(len(nvml_gpus))
    if gpu.index >= len(order):
        return gpu
    key = order[gpu.index]
    match = next(
        (
            g
            for g in nvml_gpus
            if (
                g["index"] == key if isinstance(key, int) else g["uuid"].startswith(key)
            )
        ),
        None,
    )
    if match is None:
        notes.append(f"GPU {gpu.index}: no NVML device matches {key!r}.")
        return gpu
    return dataclasses.replace(
        gpu,
        name=match["name"] if gpu.name == "GPU" else gpu.name,
        memory_total=gpu.memory_total
        if keep_memory and gpu.memory_total
        else match["memory_total"],
        compute_capability=gpu.compute_capability or match["cc"],
    )
