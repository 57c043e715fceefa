"""keras_compat section 7: a generator under a tf.distribute strategy.

Keras's TensorFlow `fit` under a strategy (`TensorFlowTrainer.
_maybe_symbolic_build`, Keras 3.15.1) reads the first batch through an
iterator of the distributed dataset only to learn its shapes, then drops
that iterator and trains through a new one. A `tf.data` pipeline is read
again from its start by the new iterator; a Python generator is not: the
batches the dropped iterator read ahead on its prefetch threads are gone, and
how many (2 to 4 on two logical CPUs) is a race. Plain `fit` therefore
skips a varying number of a generator's first batches, and two runs of one
seeded script train on different data (measured: a first epoch's loss 1.808
in one run and 1.890 in the next). No upstream issue was found (searched
2026-11-27).

`replayed` gives Keras a `tf.data` dataset whose every iterator reads the
generator's batches in the generator's order from a shared buffer: the
dropped iterator and the training one both begin at the first batch, so
nothing is skipped and runs repeat. The buffer keeps only the batches an
open iterator has yet to read (and never more than `_KEEP` behind the
newest iterator), so memory is a prefetch's worth, as in plain `fit`.

The tensor spec is Keras's own (`data_adapter_utils.get_tensor_spec` over
the first two batches, as `GeneratorDataAdapter` makes it), so the model
sees the shapes and dtypes it would have seen. Only a generator of dense
arrays is replayed (a sparse or ragged batch goes to Keras as it is).
tests/test_compat.py checks both facts against this Keras: plain `fit`
under a strategy opens two iterators of the data, and the spec is Keras's.
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from kerascale._tf import tf

# Batches kept behind the newest iterator for an older one that is still
# open (a dropped iterator that Python has not collected yet).
_KEEP = 16


class Replay:
    """One generator's batches, read in its order by several iterators.

    Args:
        source: The generator (read once, under a lock).
        first: Batches already read from it, given first.
    """

    def __init__(self, source: Iterator[Any], first: list[Any]):
        self._source = source
        self._items: list[Any] = list(first)
        self._offset = 0  # the index of self._items[0]
        self._readers: dict[int, int] = {}  # open iterator -> its next index
        self._opened = 0
        self._lock = threading.Lock()

    def reader(self) -> Iterator[Any]:
        """A new iterator. The first two begin at the first batch (Keras
        drops the first, see the module's docstring); a later one where the
        oldest open iterator is."""
        with self._lock:
            me = self._opened
            self._opened += 1
            self._readers[me] = 0 if me < 2 else self._offset
        try:
            while True:
                with self._lock:
                    i = max(self._readers[me], self._offset)
                    if i - self._offset == len(self._items):
                        try:
                            self._items.append(next(self._source))
                        except StopIteration:
                            return
                    item = self._items[i - self._offset]
                    self._readers[me] = i + 1
                    self._trim()
                yield item
        finally:
            with self._lock:
                self._readers.pop(me, None)
                self._trim()

    def _trim(self) -> None:
        # Until the second iterator opens, the first one's batches are kept
        # for it to read again.
        if self._opened < 2 or not self._readers:
            return
        low = min(self._readers.values())
        newest = self._readers[max(self._readers)]
        low = max(low, newest - _KEEP)
        if low > self._offset:
            del self._items[: low - self._offset]
            self._offset = low

    @property
    def held(self) -> int:
        """How many batches the buffer holds."""
        return len(self._items)


def replayed(x: Any, strategy: Any, fit_kwargs: dict[str, Any]) -> Any:
    """`x`, or for a generator of dense arrays trained under a strategy of
    several replicas with `steps_per_epoch` (so that Keras keeps one
    training iterator for the whole run), a `tf.data` dataset that reads it
    without skipping any batch."""
    if not inspect.isgenerator(x) or not fit_kwargs.get("steps_per_epoch"):
        return x
    if strategy is None or getattr(strategy, "num_replicas_in_sync", 1) < 2:
        return x
    from keras.src import tree
    from keras.src.trainers.data_adapters import data_adapter_utils

    first = list(itertools.islice(x, data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC))
    replay = Replay(x, first)
    dense = first and all(
        isinstance(b, tuple)
        and all(isinstance(a, np.ndarray | tf.Tensor) for a in tree.flatten(b))
        for b in first
    )
    if not dense:
        return replay.reader()  # as given: the same batches, in order
    spec = data_adapter_utils.get_tensor_spec(first)
    ds = tf.data.Dataset.from_generator(replay.reader, output_signature=spec)
    return ds.prefetch(tf.data.AUTOTUNE)
