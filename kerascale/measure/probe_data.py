"""What a probe trains on: the data's per-sample structure, carried to a
child as JSON, and synthetic batches and arrays shaped like it."""

from __future__ import annotations

from typing import Any

import numpy as np


def encode_structure(structure: Any) -> Any:
    """A nest of `tf.TensorSpec` -> JSON (tuples, lists and dicts kept)."""
    import tensorflow as tf

    if isinstance(structure, tf.TensorSpec):
        return {
            "tensor": [None if d is None else int(d) for d in structure.shape],
            "dtype": structure.dtype.name,
        }
    if isinstance(structure, dict):
        return {"dict": {k: encode_structure(v) for k, v in structure.items()}}
    if isinstance(structure, tuple | list):
        kind = "tuple" if isinstance(structure, tuple) else "list"
        return {kind: [encode_structure(v) for v in structure]}
    raise TypeError(f"Cannot encode {type(structure).__name__} in a probe spec.")


def decode_structure(encoded: Any) -> Any:
    import tensorflow as tf

    if "tensor" in encoded:
        return tf.TensorSpec(encoded["tensor"], encoded["dtype"])
    if "dict" in encoded:
        return {k: decode_structure(v) for k, v in encoded["dict"].items()}
    if "tuple" in encoded:
        return tuple(decode_structure(v) for v in encoded["tuple"])
    return [decode_structure(v) for v in encoded["list"]]


def synthetic_batch(structure: Any, batch: int, seed: int = 0) -> Any:
    """A batch of `batch` elements shaped like the per-sample `structure`:
    floats drawn from N(0, 1), integers 0 (a valid class index), strings ""."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def make(spec):
        shape = (batch, *(1 if d is None else int(d) for d in spec.shape))
        dtype = spec.dtype
        if dtype.is_floating:
            return rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
        if dtype == tf.string:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=dtype.as_numpy_dtype)

    return tf.nest.map_structure(make, structure)


def synthetic_arrays(structure: Any, samples: int) -> Any:
    """`samples` synthetic samples shaped like `structure`, every page
    written (as a user's arrays are). Drawn for a block and repeated:
    drawing every sample would take seconds for a large data set, and
    repeated values train alike."""
    import keras

    block = synthetic_batch(structure, min(samples, 1024))
    return keras.tree.map_structure(
        lambda a: np.resize(a, (samples, *a.shape[1:])), block
    )


def sample_bytes(structure: Any) -> int:
    """The bytes of one synthetic sample of `structure`."""
    import keras

    one = synthetic_batch(structure, 1)
    return sum(int(getattr(a, "nbytes", 0)) for a in keras.tree.flatten(one))
