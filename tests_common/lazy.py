"""Imports that wait for their first use, for the conftests.

pytest-xdist's controller imports the conftests but runs no test: with Keras
(and TensorFlow or JAX) imported there, each lane started 5 s later on 2
cores. A module from `module()` is imported when one of its attributes is
first read (in a worker, or a run without workers: at collection). It holds
for the conftests under tests/ and tests_jax/ (tests/test_lanes.py checks
it); a conftest in the rootdir was read in the controller too, in some runs:
the root conftest imports nothing heavy at all."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def module(name: str) -> ModuleType:
    """`name`, imported on first attribute access (importlib's LazyLoader);
    the module itself where it is already imported."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    found = importlib.util.module_from_spec(spec)
    sys.modules[name] = found
    loader.exec_module(found)
    return found


def in_controller(config) -> bool:
    """Whether this process is pytest-xdist's controller, which hands the
    tests to its workers and runs none."""
    return config.pluginmanager.has_plugin("dsession")
