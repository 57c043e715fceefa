"""Arrays as Keras's `fit` reads them, and which of them kerascale can read.

Keras trains NumPy arrays, tensors, Python lists of values, ragged and
sparse tensors, strings, and dicts with an optional input left `None`, and
batches them itself. kerascale's measurements (the batch search's probes,
the trials, the run's estimate) make up batches of the same shapes and
dtypes, which works for numbers in dense arrays only: `unsynthesisable` says
why not for the rest, and those train as Keras trains them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from kerascale import _tf


def array_like(x: Any) -> bool:
    return all(
        leaf is None
        or isinstance(leaf, np.ndarray | list | tuple | int | float | str)
        or _tf.is_instance(leaf, "Tensor")
        or _is_composite(leaf)
        or hasattr(leaf, "__array__")
        for leaf in keras.tree.flatten(x)
    )


_SCALARS = (str, bytes, int, float, bool, np.generic)


def _is_scalar_list(x: Any) -> bool:
    return (
        isinstance(x, list | tuple)
        and len(x) > 0
        and all(isinstance(e, _SCALARS) for e in x)
    )


def scalar_lists(x: Any) -> bool:
    """Whether `x` holds a Python list of values (one array to Keras)."""
    if _is_scalar_list(x):
        return True
    if isinstance(x, Mapping):
        return any(scalar_lists(v) for v in x.values())
    if isinstance(x, list | tuple):
        return any(scalar_lists(v) for v in x)
    return False


def lists_as_arrays(x: Any) -> Any:
    """`x` with its Python lists of values as NumPy arrays, as Keras reads
    them (a list of arrays stays a list: several inputs)."""
    if _is_scalar_list(x):
        return np.asarray(x)
    if isinstance(x, Mapping):
        return {k: lists_as_arrays(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        items = [lists_as_arrays(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


def _is_composite(leaf: Any) -> bool:
    return _tf.is_instance(leaf, "RaggedTensor") or _tf.is_instance(
        leaf, "SparseTensor"
    )


def unsynthesisable(x: Any, y: Any) -> str:
    """Why arrays that Keras trains cannot be read for a probe (which makes
    up batches of the same shapes and dtypes), or "": ragged or sparse
    tensors, strings, Python objects, or an input left None."""
    leaves = keras.tree.flatten(x) + ([] if y is None else keras.tree.flatten(y))
    for leaf in leaves:
        if leaf is None:
            return "an input is None (an optional input left out)"
        if _is_composite(leaf):
            return f"it holds a {type(leaf).__name__}"
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:
            try:
                dtype = np.asarray(leaf).dtype
            except Exception:
                return f"it holds a {type(leaf).__name__} that is not an array"
        if _tf.is_instance(dtype, "DType"):
            numeric = dtype.is_floating or dtype.is_integer or dtype.is_bool
        else:
            try:
                numeric = np.dtype(dtype).kind in "biuf"
            except TypeError:
                numeric = False
        if not numeric:
            return f"it holds {dtype} values (not numbers)"
    return ""


def unsplittable(x: Any, y: Any = None) -> str:
    """Why JAX cannot split a batch of these arrays evenly over devices
    (Keras lays out dense arrays only), or "": sparse or ragged values."""
    for leaf in [*_objects(x), *_objects(y)]:
        if _is_composite(leaf) or _is_sparse(leaf):
            return f"your data holds a {type(leaf).__name__}"
    return ""


def _objects(x: Any) -> list[Any]:
    """The values in nested tuples, lists and dicts, not taken apart further
    (a JAX sparse array is a tree of arrays to `keras.tree`)."""
    if x is None:
        return []
    if isinstance(x, Mapping):
        return [o for v in x.values() for o in _objects(v)]
    if isinstance(x, list | tuple):
        return [o for v in x for o in _objects(v)]
    return [x]


def _is_sparse(leaf: Any) -> bool:
    """A SciPy sparse matrix or a JAX sparse array (by module: neither
    library is imported for it)."""
    module = type(leaf).__module__ or ""
    return module.startswith(("scipy.sparse", "jax.experimental.sparse"))
