"""Process state that kerascale's own work must leave as it found it."""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Iterator

import keras
import numpy as np


@contextlib.contextmanager
def preserved_state() -> Iterator[None]:
    """Restores Python's and NumPy's global random state and Keras's dtype
    policy on exit: creating layers draws initializer seeds from Python's
    random module, which the user's own training must not see."""
    py, np_state = random.getstate(), np.random.get_state()
    policy = keras.config.dtype_policy()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        keras.config.set_dtype_policy(policy)


def value_of(variable) -> np.ndarray:
    """A Keras variable's value (or a tensor) as NumPy. Not
    `Variable.numpy()`: on JAX its `__array__` takes no `copy`, and NumPy 2
    warns on every call."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return np.array(keras.ops.convert_to_numpy(host_local(value)))


def host_local(value):
    """`value` as this process can read it: a JAX array laid out over
    several processes' devices (`jax.distributed`) gathered whole (a
    replicated one from this process's own copy); anything else as it is."""
    if getattr(value, "is_fully_addressable", True):
        return value
    if getattr(value, "is_fully_replicated", False):
        return value.addressable_data(0)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(value, tiled=True)


@contextlib.contextmanager
def quiet_variable_reads() -> Iterator[None]:
    """Silences NumPy 2's warning about Keras's own `Variable.numpy()` on
    JAX (an optimizer's `get_config` reads its learning rate that way), for
    the configs kerascale reads, which plain `fit` never asks for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array__", DeprecationWarning)
        yield
