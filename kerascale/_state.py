"""Process state that kerascale's own work must leave as it found it."""

from __future__ import annotations

import contextlib
import random
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
