"""keras_compat section 8: Keras's serialization imports TensorFlow on another
backend.

Keras's `serialize_keras_object` (under every `get_config` and `to_json`)
asks `keras.src.utils.module_utils.tensorflow.available`, which imports
TensorFlow wherever it is installed, whatever the backend
(keras-team/keras#18455, closed unfixed). On the JAX backend with TensorFlow
installed, reading a model's config then costs TensorFlow's import: 2.5 s of
the first `kerascale.fit` on this machine, where plain `fit` imports nothing
of it. Where TensorFlow is not imported yet, nothing being serialized can be
one of its objects, so `tensorflow_left_unimported` tells Keras, for the
block, that TensorFlow is unavailable, and puts Keras's own answer back
after. tests/test_compat.py fails when Keras renames the lazy module or its
`_available` flag (a JAX child then imports TensorFlow again).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def tensorflow_left_unimported() -> Iterator[None]:
    """Keras serializes in the block without importing TensorFlow, where it
    is not imported yet (else, and where Keras changed, Keras's own way)."""
    lazy = _lazy_tensorflow()
    if "tensorflow" in sys.modules or lazy is None or lazy._available is not None:
        yield
        return
    lazy._available = False
    try:
        yield
    finally:
        if lazy._available is False:
            lazy._available = None  # Keras decides when next asked


def _lazy_tensorflow() -> object | None:
    """Keras's lazy TensorFlow module, or None where Keras changed it."""
    try:
        from keras.src.utils import module_utils
    except ImportError:
        return None
    lazy = getattr(module_utils, "tensorflow", None)
    return lazy if hasattr(lazy, "_available") else None
