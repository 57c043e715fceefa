"""JAX's persistent compilation cache, on for kerascale's measurements and
the run that follows them, so that a step compiled to read its memory is not
compiled again when training starts at the same batch.

Its design: docs/design/modules.md, `kerascale.apply.jax.compile_cache`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from kerascale import _pids

_NAMES = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)
_directory: str | None = None


_PREFIX = "kerascale-xla-"


def _process_directory() -> str:
    global _directory
    if _directory is None:
        _pids.sweep(_PREFIX)
        _directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        _pids.hold(_directory)
        atexit.register(shutil.rmtree, _directory, True)
    return _directory


@contextlib.contextmanager
def on() -> Iterator[str]:
    """JAX's persistent compilation cache, every compile kept, for the
    block; yields its directory."""
    import jax

    before = {name: getattr(jax.config, name) for name in _NAMES}
    directory = before["jax_compilation_cache_dir"] or _process_directory()
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        yield directory
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
