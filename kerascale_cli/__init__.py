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


# Keras's backends (`KERAS_BACKEND`'s values), each the module it imports.
_BACKENDS = ("tensorflow", "jax", "torch")


def main(argv: Sequence[str] | None = None) -> int:
    # The command's own process: TensorFlow's C++ start-up lines (its CPU
    # instructions banner, a missing CUDA driver) are not what `doctor` or
    # `find-batch` reports, and a newcomer read them as errors. Its warnings
    # and errors still show; a level the user set is kept.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        return _cli().main(argv)
    except ModuleNotFoundError as e:
        why = _backend_missing(e)
        if why is None:
            raise
        print(f"kerascale: {why}", file=sys.stderr)
        return 2


def _backend_missing(e: ModuleNotFoundError) -> str | None:
    """What to do where importing Keras failed on its backend's module (Keras
    picks TensorFlow unless told otherwise, and a JAX install has none), or
    None for another missing module."""
    import json

    missing = (e.name or "").split(".")[0]
    if missing not in _BACKENDS:
        return None
    home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras"
    )
    config = os.path.join(home, "keras.json")
    if os.environ.get("KERAS_BACKEND"):
        chosen, source = os.environ["KERAS_BACKEND"], "KERAS_BACKEND"
    else:
        chosen, source = "tensorflow", "Keras's default"
        try:
            with open(config, encoding="utf-8") as f:
                chosen, source = json.load(f).get("backend", chosen), config
        except (OSError, ValueError, AttributeError):
            pass
    here = [
        name
        for name in _BACKENDS
        if name != missing and importlib.util.find_spec(name) is not None
    ]
    fix = (
        f"set KERAS_BACKEND={here[0]} (installed here)"
        if here
        else 'install one: pip install "kerascale[jax]" or "kerascale[tensorflow]"'
    )
    return (
        f"Keras's backend is {chosen!r} ({source}), and {missing} is not "
        f"installed here, so Keras cannot start: {fix}, or install {missing}."
    )
