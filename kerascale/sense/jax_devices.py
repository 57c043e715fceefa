"""The devices JAX trains on in this process, read from JAX itself.

On the JAX backend Keras places work on `jax.local_devices()`: every local
GPU (or TPU core), else the CPU devices, several of them where
`XLA_FLAGS=--xla_force_host_platform_device_count=N` asks for it. Reading
them initialises JAX's backends, which Keras does anyway on its first
variable. Returns plain values; `sense.hardware` makes its records of them.
"""

from __future__ import annotations

import contextlib
from typing import Any

GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def detect(notes: list[str]) -> dict[str, Any]:
    """{"platform", "cpu_devices", "gpus": [{index, name, memory_total, cc}],
    "tpu_cores", "processes", "process_index"} for this process's local
    devices, and the JAX processes joined (`jax.distributed`)."""
    import jax

    try:
        devices = jax.local_devices()
    except Exception as e:  # a broken accelerator plugin must not stop CPU work
        notes.append(f"JAX could not list its devices ({e}); assuming one CPU.")
        return {
            "platform": "cpu",
            "cpu_devices": 1,
            "gpus": [],
            "tpu_cores": 0,
            "processes": 1,
            "process_index": 0,
        }
    platform = devices[0].platform if devices else "cpu"
    found: dict[str, Any] = {
        "platform": platform,
        "cpu_devices": 0,
        "gpus": [],
        "tpu_cores": 0,
        "processes": jax.process_count(),
        "process_index": jax.process_index(),
    }
    if platform == "tpu":
        found["tpu_cores"] = len(devices)
    elif platform in GPU_PLATFORMS:
        found["gpus"] = [
            {
                "index": i,
                "name": getattr(d, "device_kind", "") or "GPU",
                "memory_total": memory_limit(d),
                "cc": _compute_capability(d),
            }
            for i, d in enumerate(devices)
        ]
    else:
        found["cpu_devices"] = len(devices)
    return found


def memory_limit(device: Any) -> int | None:
    """The bytes XLA's allocator may use on `device` (`bytes_limit` of its
    `memory_stats()`); None where the device reports none (CPU)."""
    stats = None
    with contextlib.suppress(Exception):
        stats = device.memory_stats()
    if not stats or not stats.get("bytes_limit"):
        return None
    return int(stats["bytes_limit"])


def _compute_capability(device: Any) -> tuple[int, int] | None:
    cc = getattr(device, "compute_capability", None)
    if not cc:
        return None
    with contextlib.suppress(ValueError, TypeError):
        major, minor = str(cc).split(".")[:2]
        return int(major), int(minor)
    return None
