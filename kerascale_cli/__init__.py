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


def _cli():
    loaded = sys.modules.get("kerascale.cli")
    if loaded is not None:
        return loaded
    # find_spec of a top-level package locates it without running it.
    (where,) = importlib.util.find_spec("kerascale").submodule_search_locations
    spec = importlib.util.spec_from_file_location(
        "kerascale.cli", os.path.join(where, "cli.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["kerascale.cli"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    return _cli().main(argv)
