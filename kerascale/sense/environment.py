"""What a bug report needs of the software and machine here: the platform,
the versions of the packages kerascale works with (read from their
metadata: nothing is imported for it) and the memory available."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

from kerascale._units import format_bytes
from kerascale.sense import memory

PACKAGES = ("keras", "tensorflow", "jax", "jaxlib", "numpy", "keras-tuner", "grain")
# Where a package's builds before a release are another distribution of the
# same import: Keras's nightly is `keras-nightly`, installed as `keras`.
NIGHTLIES = {"keras": "keras-nightly", "tensorflow": "tf-nightly"}


def versions() -> dict[str, str | None]:
    """Python's version and each of PACKAGES' (None: not installed): the
    distribution first on `sys.path` where its nightly is another (what
    `import` finds, as a nightly put on PYTHONPATH before a release)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        names = [n for n in (name, NIGHTLIES.get(name)) if n]
        found[name] = _first_on_path(names)
    return found


def _first_on_path(names: list[str]) -> str | None:
    for entry in sys.path:
        for name in names:
            for dist in metadata.distributions(name=name, path=[entry]):
                return dist.version
    return None


def environment() -> dict[str, Any]:
    """The platform, `versions()` and the memory available."""
    available = memory.available_bytes()
    return {
        "platform": platform.platform(),
        "versions": versions(),
        "memory_available": available,
        "memory_available_text": format_bytes(available) if available else "unknown",
    }
