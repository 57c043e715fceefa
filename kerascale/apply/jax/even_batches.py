"""Each batch split evenly over the devices, and each process given its share.

Its design: docs/design/modules.md, `kerascale.apply.jax.even_batches`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from kerascale.errors import warn
from kerascale.sense.arrays import lists_as_arrays

if TYPE_CHECKING:
    from kerascale.sense.data_facts import DataFacts


@dataclasses.dataclass(frozen=True)
class Share:
    """How a global batch is split.

    Attributes:
        replicas: The devices that split each global batch (all processes').
        processes: The processes that each give a share of it.
        index: This process's index among them.
    """

    replicas: int
    processes: int = 1
    index: int = 0

    @property
    def changes_anything(self) -> bool:
        return self.replicas > 1 or self.processes > 1

    def kept(self, size: int) -> int:
        """The samples of a batch of `size` that the devices divide."""
        return size - size % self.replicas

    def dropped(self, num_samples: int, batch: int) -> int:
        """Samples of `num_samples` left out each epoch at global `batch`:
        the last batch's remainder that the devices do not divide."""
        return (num_samples % batch) % self.replicas

    def block(self, size: int) -> slice:
        """This process's part of a global batch of `size` (a multiple of
        `replicas`, so of `processes`)."""
        part = size // self.processes
        return slice(self.index * part, (self.index + 1) * part)

    def rows(self, num_samples: int, batch: int) -> Any:
        """The rows of arrays of `num_samples` that this process reads at
        global `batch`: a slice on one process, an index array on several."""
        total = num_samples - self.dropped(num_samples, batch)
        if self.processes == 1:
            return slice(0, total)
        starts = range(0, total, batch)
        return np.concatenate(
            [
                np.arange(start, min(start + batch, total))[
                    self.block(min(batch, total - start))
                ]
                for start in starts
            ]
        )

    def local_batch(self, batch: int) -> int:
        """What `fit`'s `batch_size` is on each process for global `batch`."""
        return batch // self.processes

    def of_batch(self, element: Any) -> Any:
        """This process's share of one batch (any structure of arrays with
        the samples first), the remainder the devices do not divide left out."""
        leaves = [leaf for leaf in keras.tree.flatten(element) if leaf is not None]
        if not leaves:
            return element
        size = int(np.shape(leaves[0])[0])
        cut = self.block(self.kept(size))
        return keras.tree.map_structure(
            lambda leaf: None if leaf is None else leaf[cut], element
        )


def arrays(x: Any, y: Any, sample_weight: Any, share: Share, batch: int) -> tuple:
    """(x, y, sample_weight, batch_size) for this process's `fit`: the rows
    it reads of the user's arrays, and its local batch."""
    x, y = lists_as_arrays(x), lists_as_arrays(y)
    sample_weight = lists_as_arrays(sample_weight)
    leaves = [leaf for leaf in keras.tree.flatten(x) if leaf is not None]
    if not leaves:  # no input at all: Keras says which it needs
        return x, y, sample_weight, share.local_batch(batch)
    n = int(np.shape(leaves[0])[0])
    rows = share.rows(n, batch)

    def take(data: Any) -> Any:
        if data is None:
            return None
        return keras.tree.map_structure(
            lambda leaf: None if leaf is None else leaf[rows], data
        )

    return take(x), take(y), take(sample_weight), share.local_batch(batch)


def wrap(x: Any, share: Share) -> Any:
    """`x` (a `PyDataset`, a generator or a grain dataset: what
    `DataFacts.splittable` says) yielding this process's share of each of
    its batches."""
    said = _SaidOnce(share)
    if isinstance(x, keras.utils.PyDataset):
        return SharedPyDataset(x, share, said)
    if inspect.isgenerator(x):
        return (said(element) for element in x)
    return x.map(said)


class _SaidOnce:
    """Cuts a batch to this process's share, and warns once where the devices
    did not divide it."""

    def __init__(self, share: Share):
        self.share, self.said = share, False

    def __call__(self, element: Any) -> Any:
        leaves = [leaf for leaf in keras.tree.flatten(element) if leaf is not None]
        size = int(np.shape(leaves[0])[0]) if leaves else 0
        lost = size - self.share.kept(size)
        if lost and not self.said:
            self.said = True
            warn(
                f"A batch of {size} samples was cut to {size - lost}: JAX splits "
                f"each batch evenly over the {self.share.replicas} devices, and "
                f"they do not divide {size}. Make your batches a multiple of "
                f"{self.share.replicas} to keep every sample, or pass "
                'strategy="default" to train on one device.'
            )
        return self.share.of_batch(element)


class SharedPyDataset(keras.utils.PyDataset):
    """A `PyDataset` whose every batch is cut to this process's share; the
    rest (its length, epochs, workers) is the wrapped one's."""

    def __init__(
        self,
        inner: keras.utils.PyDataset,
        share: Share,
        said: _SaidOnce | None = None,
    ):
        super().__init__(
            workers=inner.workers,
            use_multiprocessing=inner.use_multiprocessing,
            max_queue_size=inner.max_queue_size,
        )
        self.inner, self.share = inner, share
        self._said = said or _SaidOnce(share)

    @property
    def num_batches(self) -> int | None:
        return self.inner.num_batches

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        return self._said(self.inner[index])

    def on_epoch_begin(self) -> None:
        self.inner.on_epoch_begin()

    def on_epoch_end(self) -> None:
        self.inner.on_epoch_end()


def split_inputs(
    x: Any,
    y: Any,
    facts: DataFacts,
    share: Share,
    batch: int,
    kwargs: dict[str, Any],
) -> tuple[Any, Any, dict[str, Any]]:
    """(x, y, fit's kwargs) with each global batch of `batch` split as
    `share` says: arrays cut up front (with their `sample_weight`), a
    splittable input wrapped, and the validation data alike. A
    `validation_split` of arrays is taken here, as Keras takes it (the last
    fraction of the samples), so that both parts are split evenly."""
    kwargs = dict(kwargs)
    if facts.kind == "arrays":
        split = kwargs.pop("validation_split", None)
        if split:
            (x, y, weights), held_out = _validation_split(
                (x, y, kwargs.get("sample_weight")), split
            )
            kwargs["sample_weight"] = weights
            kwargs.setdefault("validation_data", held_out)
        x, y, weights, kwargs["batch_size"] = arrays(
            x, y, kwargs.get("sample_weight"), share, batch
        )
        if weights is not None:
            kwargs["sample_weight"] = weights
    elif facts.splittable:
        x = wrap(x, share)
    if kwargs.get("validation_data") is not None:
        every = kwargs.get("validation_batch_size") or batch
        kwargs["validation_data"] = _validation(kwargs["validation_data"], share, every)
        if kwargs.get("validation_batch_size"):
            kwargs["validation_batch_size"] = share.local_batch(every)
    return x, y, kwargs


def _validation(data: Any, share: Share, batch: int) -> Any:
    if isinstance(data, tuple) and data and _is_arrays(data[0]):
        vx, vy, vw = (*data, None, None)[:3]
        vx, vy, vw, _ = arrays(vx, vy, vw, share, batch)
        return (vx, vy) if vw is None else (vx, vy, vw)
    if isinstance(data, keras.utils.PyDataset) or inspect.isgenerator(data):
        return wrap(data, share)
    return data  # a tf.data.Dataset (Keras shards it) or what Keras reads alone


def _is_arrays(x: Any) -> bool:
    leaves = keras.tree.flatten(x)
    return bool(leaves) and all(hasattr(leaf, "shape") for leaf in leaves)


def _validation_split(data: tuple, split: float) -> tuple[tuple, tuple]:
    """(train, validation) of `data` as Keras's `validation_split` takes
    them (keras/src/trainers/data_adapters/array_slicing.py:
    train_validation_split): the last `split` of the samples."""
    leaves = [leaf for leaf in keras.tree.flatten(data) if leaf is not None]
    n = int(np.shape(leaves[0])[0])
    at = math.floor(n * (1.0 - split))

    def part(rows: slice) -> tuple:
        return tuple(
            None if d is None else keras.tree.map_structure(lambda a, r=rows: a[r], d)
            for d in data
        )

    train, held = part(slice(0, at)), part(slice(at, n))
    return train, tuple(d for d in held if d is not None)
