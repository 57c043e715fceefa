"""TensorFlow, imported when first used: kerascale runs without it.

As in Keras, the backend is the user's choice, and a JAX user need not install
TensorFlow. Modules that use TensorFlow for what only TensorFlow does (a
`tf.data` input, `tf.distribute`, TensorBoard event files) write
`from kerascale._tf import tf`: the name is bound at import, and TensorFlow
itself is imported on the first attribute read. Without TensorFlow installed
that read raises `ModuleNotFoundError` saying how to install it.

`loaded()` answers "could this object be a TensorFlow one?" without importing
anything: no value is a `tf.data.Dataset` or a `tf.Tensor` unless the process
already imported TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

INSTALL_HINT = 'pip install "kerascale[tensorflow]"'


def loaded() -> bool:
    """Whether this process has imported TensorFlow (no import is made)."""
    return "tensorflow" in sys.modules


def available() -> bool:
    """Whether TensorFlow can be imported here (no import is made)."""
    return loaded() or importlib.util.find_spec("tensorflow") is not None


class _Lazy(types.ModuleType):
    """Stands for the `tensorflow` module until an attribute is read."""

    def __getattr__(self, name: str) -> Any:
        try:
            module = importlib.import_module("tensorflow")
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"TensorFlow is not installed, and this part of kerascale needs "
                f"it (tf.{name}). Install it with `{INSTALL_HINT}`, or use an "
                "input and options that need no TensorFlow (arrays, PyDataset, "
                "generators, grain).",
                name="tensorflow",
            ) from e
        return getattr(module, name)

    def __repr__(self) -> str:
        return "<tensorflow, imported on first use by kerascale>"


tf: Any = _Lazy("tensorflow")


def is_instance(value: Any, *path: str) -> bool:
    """`isinstance(value, tf.<path>)`, False without importing TensorFlow
    when the process has not imported it (then no value is TensorFlow's).

    Example: `is_instance(x, "data", "Dataset")`.
    """
    if not loaded():
        return False
    cls: Any = sys.modules["tensorflow"]
    for part in path:
        cls = getattr(cls, part)
    return isinstance(value, cls)


class _Retracing(logging.Filter):
    """Drops tf.function's "N out of the last N calls ... triggered
    tf.function retracing" from TensorFlow's Python logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


_RETRACING = _Retracing()


@contextlib.contextmanager
def quiet_retracing() -> Iterator[None]:
    """Silences tf.function's retracing warning for kerascale's own
    measurements (its probes, trials and reference steps trace each model's
    train step anew, on purpose: a newcomer read TensorFlow's warning about
    it as a bug of their own). Only that message, and only inside: the
    user's own training says it as TensorFlow would. Nests; nothing is
    imported (TensorFlow's logger is the `logging` one named "tensorflow")."""
    logger = logging.getLogger("tensorflow")
    if _RETRACING in logger.filters:
        yield
        return
    logger.addFilter(_RETRACING)
    try:
        yield
    finally:
        logger.removeFilter(_RETRACING)
