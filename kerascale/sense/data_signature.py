"""What identifies a training data set for the cache: its size, its element
structure, and the chain of transformations with the graph of each function
it maps (not the values it reads)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import keras

from kerascale import _tf_compat as tfc
from kerascale.sense.data_facts import chain, is_dataset


def signature(x: Any) -> str:
    """What identifies the training data for caching a measured decision:
    its size, its element structure, and the chain of transformations with
    the graph of each function it maps (not the values it reads)."""
    if is_dataset(x):
        steps = []
        for d in chain(x):
            step: list[Any] = [type(d).__name__]
            size = tfc.static_batch_size(d)
            if size is not None:
                step.append(repr(size))
            step += [_function_graph(w) for w in tfc.dataset_functions(d)]
            steps.append(step)
        return repr((steps, x.element_spec, int(x.cardinality())))
    leaves = keras.tree.flatten(x)
    return repr(
        [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for a in leaves]
    )


_GENERATED = re.compile(r"_\d+\b|__inference_\w+")


def _function_graph(wrapper: Any) -> str:
    """A hash of a dataset function's graph: each op and its attributes,
    without the names TensorFlow generates per process (so an edited map
    function is told apart, and the same one is recognised next run)."""
    try:
        graph = wrapper.function.graph.as_graph_def()
    except Exception:  # a private structure changed: the chain alone decides
        return "?"
    nodes = [*graph.node]
    for fn in graph.library.function:
        nodes += [*fn.node_def]
    text = repr(
        sorted(
            (n.op, sorted((k, str(v)) for k, v in n.attr.items() if k != "_class"))
            for n in nodes
        )
    )
    return hashlib.sha256(_GENERATED.sub("", text).encode()).hexdigest()[:16]
