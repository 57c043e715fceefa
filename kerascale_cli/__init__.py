"""The `kerascale` command's entry point, outside the `kerascale` package:
importing that imports Keras and its backend (seconds), which `--help`,
`--version` and a mistyped argument do not need. The command line is
kerascale/cli.py's, loaded from its file; a command imports the package
when it runs."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence


def _load(name: str) -> object:
    """`kerascale.<name>` from its file, registered under its name, without
    running the package's `__init__` (an import of `kerascale.<name>` then
    finds it, and imports nothing more)."""
    full = f"kerascale.{name}"
    loaded = sys.modules.get(full)
    if loaded is not None:
        return loaded
    # find_spec of a top-level package locates it without running it.
    (where,) = importlib.util.find_spec("kerascale").submodule_search_locations
    spec = importlib.util.spec_from_file_location(
        full, os.path.join(where, f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def _cli():
    _load("_version")  # what cli.py imports at its top
    return _load("cli")


def main(argv: Sequence[str] | None = None) -> int:
    # The command's own process: TensorFlow's C++ start-up lines (its CPU
    # instructions banner, a missing CUDA driver) are not what `doctor` or
    # `find-batch` reports, and a newcomer read them as errors. Its warnings
    # and errors still show; a level the user set is kept.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return _cli().main(argv)
