"""What a bug report needs of the software and machine here: the platform,
the versions of the packages kerascale works with (read from their
metadata: nothing is imported for it) and the memory available."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from kerascale._units import format_bytes
from kerascale.sense import memory

PACKAGES = ("keras", "tensorflow", "jax", "jaxlib", "numpy", "keras-tuner", "grain")


def versions() -> dict[str, str | None]:
    """Python's version and each of PACKAGES' (None: not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def environment() -> dict[str, Any]:
    """The platform, `versions()` and the memory available."""
    available = memory.available_bytes()
    return {
        "platform": platform.platform(),
        "versions": versions(),
        "memory_available": available,
        "memory_available_text": format_bytes(available) if available else "unknown",
    }
