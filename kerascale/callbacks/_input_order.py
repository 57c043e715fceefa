"""A resume's data order: put back where Keras keeps it, and checked rather
than trusted (issue 56).

From Keras 3.16 the shuffle is seeded from the data adapter's epoch counter
(`_keras_compat.epoch_order`), which `restore_counter` puts back. Whatever
else a Keras may change, `check` tells: a save records the digest of the
last batch trained (`Digests`, `batch_digest`), and the resume compares the
last batch it reads again with it, and warns once, naming the cause.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascale import _keras_compat as keras_compat
from kerascale._keras_compat import epoch_order
from kerascale.errors import warn


def restore_counter(
    adapter: Any, record: dict[str, Any], warn_order: Callable[[str], None]
) -> int | None:
    """Puts back Keras's epoch counter (Keras 3.16's shuffle seed) on
    `adapter`, before the iterator reads it; returns it, or None where there
    is none to put back. Says so (`warn_order`) where the checkpoint's Keras
    and this one order an epoch differently."""
    saved = record.get("adapter_epoch")
    if saved is not None and epoch_order.counter(adapter) is not None:
        epoch_order.set_counter(adapter, saved)
        return int(saved)
    if saved is not None and adapter is not None:
        warn_order(
            "the checkpoint was written by a Keras that seeds the shuffle "
            "from its epoch counter, and this Keras does not"
        )
    return None


def check(
    record: dict[str, Any], last: Any, written_with: str | None, carried: int = 0
) -> None:
    """Warns where the last batch read again (`last`) is not the last batch
    the interrupted run trained before its save: the resumed run then trains
    on another order. The likely cause: `written_with`, the Keras that wrote
    the checkpoint (its meta.json's versions); batches Keras's enqueuer
    `carried` into the epoch from before it, where the save came within
    them; or the input."""
    saved = record.get("last_batch")
    if saved is None or last is None or batch_digest(last) == saved:
        return
    if written_with and written_with != keras.__version__:
        cause = (
            f"the checkpoint was written with Keras {written_with} and this "
            f"is Keras {keras.__version__}, which orders an epoch differently"
        )
    elif 0 < int(record.get("consumed", 0)) <= carried:
        cause = (
            f"Keras's enqueuer (a PyDataset with workers) began the epoch with "
            f"{carried} batches read before it ({epoch_order.CARRIED_UPSTREAM}), "
            f"which a checkpoint does not hold, and the save came within them; "
            f"a save after an epoch's first {carried} steps resumes exactly"
        )
    else:
        cause = (
            "the input changed between the runs, or its order depends on "
            "something the checkpoint does not hold"
        )
    warn(
        "The data order after this resume differs from the interrupted "
        f"run's ({cause}): the last batch read again is not the one it "
        "trained before its save. Training goes on; the weights will not "
        "match an uninterrupted run."
    )


class Digests:
    """The digests (`batch_digest`) of the last batches a reader gave, by
    their number since it started: a reader ahead of the step (`Prefetch`,
    `tf.data`'s prefetch) reads more than the step has trained. Thread-safe:
    on TensorFlow the batches are given on `tf.data`'s threads."""

    KEPT = 64

    def __init__(self):
        self._lock = threading.Lock()
        self._reads = 0
        self._kept: collections.deque[tuple[int, str | None]] = collections.deque(
            maxlen=self.KEPT
        )

    def restart(self) -> None:
        """The reader starts again from its first batch."""
        with self._lock:
            self._reads = 0
            self._kept.clear()

    def add(self, batch: Any, steps: int = 1) -> None:
        """Keeps `batch`'s digest, numbered by the steps read so far (a read
        of stacked batches holds `steps`). Never raises: it runs where Keras
        reads the batch, and a batch it cannot digest (a sparse matrix, say)
        trains as in plain `fit`, with no digest for a resume to check."""
        try:
            digest: str | None = batch_digest(batch)
        except Exception:
            digest = None
        with self._lock:
            self._reads += steps
            self._kept.append((self._reads, digest))

    def digest(self, number: int) -> str | None:
        """The digest of the `number`-th batch read, while kept."""
        with self._lock:
            return next((d for n, d in self._kept if n == number), None)


class Peek:
    """Keras's iterator as the step reads it (JAX), with the `Digests` of
    the batches read."""

    def __init__(self, iterator: Any, super_batch: int = 0):
        self.iterator = iterator
        self.digests = Digests()
        self.super_batch = super_batch  # `keras_compat.super_batch`

    def __iter__(self) -> Peek:
        return self

    def __next__(self) -> Any:
        batch = next(self.iterator)
        self.digests.add(batch, keras_compat.steps_in_read(batch, self.super_batch))
        return batch


def batch_digest(batch: Any) -> str:
    """A digest of a batch's first and last sample (`SPREAD` values of
    each), with every array's dtype and shape, the same for a NumPy batch
    and the tensors it becomes: what tells one data order from another, at
    a few microseconds a step."""
    digest = hashlib.sha256()
    for leaf in keras.tree.flatten(batch):
        shape = getattr(leaf, "shape", None)
        if leaf is None or shape is None or len(shape) == 0:
            digest.update(repr(leaf).encode()[:64])
            continue
        local = _local_part(leaf)
        samples = [np.asarray(local[0]), np.asarray(local[-1])]
        digest.update(f"{samples[0].dtype}{tuple(int(d) for d in shape)}".encode())
        for sample in samples:
            flat = sample.reshape(-1)
            # At most SPREAD values, strided across the sample (its interior
            # too, where padding or a border fills its start): 2 images of
            # 224x224x3 cost 33 us a step this way, 812 us hashed whole.
            spread = flat[:: max(1, flat.size // SPREAD)]
            digest.update(np.ascontiguousarray(spread).tobytes())
    return digest.hexdigest()[:32]


SPREAD = 256  # values of a sample the digest reads


def _local_part(leaf: Any) -> Any:
    """This process's part of a batch: a global JAX array that spans several
    processes is sliced only in its first local shard (slicing the whole is
    a computation every process must join, which the others are not in)."""
    if getattr(leaf, "is_fully_addressable", True):
        return leaf
    return leaf.addressable_shards[0].data
