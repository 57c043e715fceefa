"""Samples of the training data's shapes, for building and probing a model.

`sample_inputs` is one sample's inputs (an unbuilt model is built from their
shapes); `element_structure` is the per-sample structure a batch-size probe
synthesises, with every dimension known. Neither advances a dataset's
shuffle (`data_facts.peekable`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import keras
import numpy as np

from kerascale._tf import tf
from kerascale.sense.data_facts import DataFacts, peekable


def sample_inputs(x: Any, facts: DataFacts) -> Any:
    """A one-sample batch of inputs, to build an unbuilt model."""
    if facts.kind == "arrays":
        return keras.tree.map_structure(lambda a: np.asarray(a)[:1], x)
    if facts.kind == "pydataset":
        first = x[0]
        inputs = first[0] if isinstance(first, tuple) else first
        return keras.tree.map_structure(lambda a: np.asarray(a)[:1], inputs)
    spec = x.element_spec
    inputs = spec[0] if isinstance(spec, tuple) else spec

    def zeros(s):
        shape = [1 if d is None else d for d in s.shape]
        if facts.batched:
            shape[0] = 1
        else:
            shape = [1, *shape]
        return tf.zeros(shape, dtype=s.dtype)

    return tf.nest.map_structure(zeros, inputs)


# element_structure per dataset object: the budget's estimate and the probes.
_ELEMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def element_structure(x: Any, y: Any, facts: DataFacts, *, scan: int = 64) -> Any:
    """The per-sample structure of the training data as `tf.TensorSpec`s with
    every dimension known: what a batch-size probe synthesises.

    Where a dimension varies (variable-length sequences), the largest value
    among the first `scan` elements is used, so that the probe is not easier
    than training.
    """
    if facts.kind == "arrays":

        def spec(a):
            a = np.asarray(a) if not hasattr(a, "dtype") else a
            return tf.TensorSpec(a.shape[1:], tf.as_dtype(a.dtype))

        inputs = tf.nest.map_structure(spec, x)
        return inputs if y is None else (inputs, tf.nest.map_structure(spec, y))
    if facts.kind == "pydataset":
        first = x[0]
        return tf.nest.map_structure(
            lambda a: tf.TensorSpec(np.shape(a)[1:], tf.as_dtype(np.asarray(a).dtype)),
            tuple(first) if isinstance(first, list) else first,
        )
    ds = x.unbatch() if facts.batched else x
    element = ds.element_spec
    flat = tf.nest.flatten(element)
    if all(s.shape.is_fully_defined() for s in flat):
        return element
    with contextlib.suppress(KeyError, TypeError):
        return _ELEMENTS[x][facts.batched, scan]
    largest = [list(s.shape) for s in flat]
    for item in peekable(ds).take(scan):
        for i, t in enumerate(tf.nest.flatten(item)):
            largest[i] = [
                max(d or 0, n) for d, n in zip(largest[i], t.shape, strict=True)
            ]
    found = tf.nest.pack_sequence_as(
        element,
        [
            tf.TensorSpec([max(1, d or 1) for d in dims], s.dtype)
            for dims, s in zip(largest, flat, strict=True)
        ],
    )
    with contextlib.suppress(TypeError):  # once per dataset object
        _ELEMENTS.setdefault(x, {})[facts.batched, scan] = found
    return found
