"""What planning needs to know about the training data, and reading it.

`inspect` learns the facts planning needs (a dataset, a PyDataset or arrays,
batched or not, the user's own batch size, whether it reads files, whether a
cache of it is safe) and rejects data that cannot train with a clear error.
The other functions read a `tf.data` pipeline without changing it: its batch
size, its chain of transformations, whether it shuffles without a seed or has
stateful operations, and the per-sample structure a batch-size probe
synthesises. Changing the data is `kerascale.apply.data`'s job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect as pyinspect
import logging
import math
import weakref
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from kerascale import _tf
from kerascale import _tf_compat as tfc
from kerascale._tf import tf
from kerascale._units import format_bytes
from kerascale.errors import DataError, first_line
from kerascale.sense import arrays, first_batch
from kerascale.sense import backend as backend_lib
from kerascale.sense.memory import available_bytes

logger = logging.getLogger("kerascale")


@dataclasses.dataclass(frozen=True)
class DataFacts:
    """What planning needs to know about the training data.

    Attributes:
        kind: "dataset", "pydataset", "arrays", or "other": anything else
            Keras's `fit` takes (a generator, a grain or torch loader, an
            iterator), which kerascale passes to Keras unread: reading it
            would consume it.
        batched: Whether a dataset arrives already batched.
        batch_size: The batch of an already-batched dataset, else None.
        num_samples: Samples per epoch where known (arrays; datasets of known
            length, counting a batched one's last batch as full), else None.
        from_files: Whether a dataset reads files (TFRecord, text lines...),
            which lets a distributed strategy shard it by file.
        cacheable: Whether a dataset gives the same elements every epoch (no
            shuffle, no random or Python ops), has a known length, and fits
            in a quarter of the memory available: `cache()` then spares
            re-computing it.
        splittable: Whether each batch can be cut as it is read, without
            reading ahead (a `PyDataset`, a generator, a grain dataset): how
            JAX's devices and processes get their even shares of it.
        unsplittable: Why no batch of it can be split over devices (sparse
            or ragged values), or "".
        held_out: Samples of arrays `validation_split` holds back (not in
            `num_samples`).
        sequential_map: Whether a dataset maps a function one element at a
            time (a `map` without `num_parallel_calls`), which tf.data's
            map parallelization then runs in parallel.
        steps_given: Whether `fit` has `steps_per_epoch` (arrays).
        autotune_set: Whether a dataset's own options set tf.data's
            autotuning (`options.autotune.enabled`): kerascale then leaves
            it as set.
    """

    kind: str
    batched: bool = False
    batch_size: int | None = None
    num_samples: int | None = None
    from_files: bool = False
    cacheable: bool = False
    why_not_measurable: str = ""
    splittable: bool = False
    unsplittable: str = ""
    held_out: int = 0
    sequential_map: bool = False
    steps_given: bool = False
    autotune_set: bool = False

    @property
    def measurable(self) -> bool:
        """Whether kerascale can read or synthesise this data for its
        measurements (the batch search, the trials, the run's estimate)."""
        return not self.why_not_measurable


def as_structure(data: Any) -> Any:
    """`data` with its lists made tuples: Keras takes a list of arrays as
    several inputs, `tf.data` would stack them into one tensor."""
    if isinstance(data, list):
        return tuple(as_structure(v) for v in data)
    if isinstance(data, tuple):
        return tuple(as_structure(v) for v in data)
    if isinstance(data, Mapping):
        return {k: as_structure(v) for k, v in data.items()}
    return data


def is_dataset(x: Any) -> bool:
    return _tf.is_instance(x, "data", "Dataset")


def leading_dims(structure: Any) -> list[int]:
    dims = []
    for a in keras.tree.flatten(structure):
        if a is None:  # an optional input left out
            continue
        shape = getattr(a, "shape", None)
        if shape is None:
            a = np.asarray(a)
            shape = a.shape
        if len(shape) == 0:
            raise DataError(
                "x and y must hold one row per sample, but an entry is a scalar "
                f"(shape ()). Received: {type(a).__name__} with shape ()"
            )
        dims.append(int(shape[0]))
    return dims


def passthrough_reason(facts: DataFacts, backend: str = "tensorflow") -> str:
    """What kerascale skipped for data it cannot read, and how to get it, or
    "" (the plan's one warning about it)."""
    if facts.measurable:
        return ""
    what = (
        "its batch size, the input-pipeline changes, the batch-size search and "
        "the CPU trials"
        if facts.kind == "other"
        else "the batch-size search and the CPU trials"
    )
    return (
        f"kerascale passes your data to Keras as it is, because "
        f"{facts.why_not_measurable}; skipped: {what}. To get them, pass "
        f"{readable_inputs(backend)}."
    )


def readable_inputs(backend: str) -> str:
    """The inputs whose samples kerascale reads on `backend`."""
    return backend_lib.traits(backend).readable_inputs


def inspect(
    x: Any,
    y: Any = None,
    *,
    steps_per_epoch: Any = None,
    validation_split: Any = None,
    name: str = "x",
    steps_name: str = "steps_per_epoch",
) -> DataFacts:
    """Learns what planning needs to know about `x`/`y`, validating them.

    Args:
        x: A `tf.data.Dataset` (batched or not, yielding `(x, y)` or
            `(x, y, sample_weight)`), a `keras.utils.PyDataset`, arrays
            (NumPy, tensors, Python lists, or a dict or list of them), or
            anything else Keras's `fit` takes (kind "other", not read).
        y: Targets when `x` is arrays; must be None for a dataset.
        steps_per_epoch: Needed when the dataset is infinite.
        validation_split: `fit`'s: arrays' `num_samples` counts the samples
            it leaves to train (`held_out` the rest).
        name: How to name `x` in errors (e.g. "validation_data").
        steps_name: How to name `steps_per_epoch` in errors.

    Raises:
        DataError: For empty data, an infinite dataset without
            `steps_per_epoch`, or mismatched lengths.
    """
    if x is None:
        raise DataError(f"{name} is required. Received: {name}=None")
    if is_dataset(x):
        if y is not None:
            raise DataError(
                "y must be None when x is a tf.data.Dataset: the dataset yields "
                f"(inputs, targets). Received: y of type {type(y).__name__}"
            )
        return _inspect_dataset(
            x, steps_per_epoch=steps_per_epoch, name=name, steps_name=steps_name
        )
    if isinstance(x, keras.utils.PyDataset):
        return _inspect_pydataset(x, y, name=name)
    if isinstance(x, Mapping) or arrays.array_like(x):
        listed = arrays.scalar_lists(x) or (y is not None and arrays.scalar_lists(y))
        x, y = arrays.lists_as_arrays(x), arrays.lists_as_arrays(y)
        facts = _held_out(_inspect_arrays(x, y, name=name), validation_split)
        unsplittable, given = arrays.unsplittable(x, y), steps_per_epoch is not None
        facts = dataclasses.replace(facts, unsplittable=unsplittable, steps_given=given)
        why = arrays.unsynthesisable(x, y) or (
            "it holds Python lists of values (pass NumPy arrays)" if listed else ""
        )
        return dataclasses.replace(facts, why_not_measurable=why) if why else facts
    # A generator, a grain or torch loader, an iterator: Keras reads it, and
    # raises its own error for what it cannot. A generator's first batch,
    # read at the door (`first_read`), tells its size and kind.
    first = first_batch.first_of(x)
    batch, unsplittable = None, ""
    if first is not None:
        inputs = first[0] if isinstance(first, tuple) else first
        unsplittable = arrays.unsplittable(first)
        with contextlib.suppress(Exception):
            batch = (leading_dims(inputs) or [None])[0]
    return DataFacts(
        kind="other",
        batched=True,
        batch_size=batch,
        why_not_measurable=(
            f"a {type(x).__name__} cannot be read ahead without consuming it"
        ),
        splittable=pyinspect.isgenerator(x) or _is_grain(x),
        unsplittable=unsplittable,
    )


def _held_out(facts: DataFacts, split: Any) -> DataFacts:
    """`facts` of arrays with the samples `fit`'s `validation_split` holds
    back taken out of `num_samples` (Keras trains on the first
    floor(n * (1 - split)) of them), so that a batch search's ceiling and
    the batch's check against the data count what trains. A split Keras
    will refuse changes nothing here."""
    n = facts.num_samples
    if not n or isinstance(split, bool) or not isinstance(split, int | float):
        return facts
    if not 0 < split < 1:
        return facts
    training = math.floor(n * (1.0 - split))
    return dataclasses.replace(facts, num_samples=training, held_out=n - training)


def indexable_grain(x: Any) -> bool:
    """Whether `x` is a grain `MapDataset` (batch i is `x[i]`, of `len(x)`),
    which can be read again and again, unlike a grain `IterDataset`."""
    return _is_grain(x) and hasattr(x, "__getitem__") and hasattr(x, "__len__")


def _is_grain(x: Any) -> bool:
    module = type(x).__module__ or ""
    return module.split(".")[0] == "grain" and callable(getattr(x, "map", None))


def _inspect_pydataset(x: Any, y: Any, *, name: str) -> DataFacts:
    # A PyDataset makes its own batches: read the size of the first one.
    if y is not None:
        raise DataError(
            f"y must be None when {name} is a PyDataset: it yields (inputs, "
            f"targets). Received: y of type {type(y).__name__}"
        )
    n = x.num_batches
    if n == 0:
        raise DataError(f"{name} is an empty PyDataset (0 batches).")
    first = x[0]
    inputs = first[0] if isinstance(first, tuple) else first
    (batch, *_) = leading_dims(inputs)
    return DataFacts(kind="pydataset", batched=True, batch_size=batch, splittable=True)


def _inspect_arrays(x: Any, y: Any, *, name: str) -> DataFacts:
    x_dims = leading_dims(x)
    if not x_dims:  # only None: Keras says which input it needs
        return DataFacts(kind="arrays", why_not_measurable="it holds no arrays")
    y_dims = leading_dims(y) if y is not None else []
    n = x_dims[0]
    if len(set(x_dims)) > 1 or (y is not None and set(y_dims) != {n}):
        # Keras's words (`check_data_cardinality`), the sizes as numbers.
        sizes = ", ".join(
            f"'{label}' sizes: {', '.join(str(d) for d in dims)}"
            for label, dims in ((name, x_dims), ("y", y_dims))
            if dims
        )
        raise DataError(
            "Data cardinality is ambiguous. Make sure all arrays contain the "
            f"same number of samples. {sizes}"
        )
    if n == 0:
        raise DataError(f"{name} is empty (0 samples): there is nothing to train on.")
    return DataFacts(kind="arrays", batched=False, batch_size=None, num_samples=n)


def _inspect_dataset(
    ds: tf.data.Dataset, *, steps_per_epoch: Any, name: str, steps_name: str
) -> DataFacts:
    cardinality = int(ds.cardinality())
    if cardinality == 0:
        raise DataError(f"{name} is an empty dataset (0 elements).")
    if cardinality == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
        raise DataError(
            f"{name} is an infinite dataset (it repeats forever), so it never "
            f"ends. Pass {steps_name}=N, or remove .repeat(). "
            f"Received: {steps_name}=None"
        )
    batch = dataset_batch_size(ds)
    samples = None
    if (
        cardinality >= 0
    ):  # known: elements, or batches of `batch` (the last may be short)
        samples = cardinality * batch if batch else cardinality
    composite = [
        type(spec).__name__
        for spec in tf.nest.flatten(ds.element_spec)
        if not isinstance(spec, tf.TensorSpec)
    ]
    return DataFacts(
        kind="dataset",
        batched=batch is not None,
        batch_size=batch,
        num_samples=samples,
        from_files=reads_files(ds),
        cacheable=cacheable(ds)[0],
        unsplittable=f"your data holds a {composite[0]}" if composite else "",
        sequential_map=sequential_map(ds),
        autotune_set=autotune_set(ds),
    )


# Datasets that read records from files, by class name (public constructors
# return these private classes: tf.data.TFRecordDataset() -> TFRecordDatasetV2).
_FILE_READERS = (
    "TFRecordDatasetV2",
    "_TFRecordDataset",
    "TextLineDatasetV2",
    "_TextLineDataset",
    "FixedLengthRecordDatasetV2",
    "_FixedLengthRecordDataset",
)


UNSEEDED_SHUFFLE_ON_CLUSTER = (
    "Your dataset shuffles without a seed. On a cluster every worker reads the "
    "whole pipeline and keeps its share, so each would shuffle differently and "
    "an epoch would see some samples twice and miss others: pass "
    "shuffle(..., seed=N), or call keras.utils.set_random_seed(N) before "
    "building the dataset."
)


def unseeded_shuffle(ds: Any) -> bool:
    """True when the pipeline has a `shuffle` with neither an op seed nor a
    global seed, so its order differs between processes."""
    node, seen = ds, 0
    while node is not None and seen < 200:
        seen += 1
        shuffle = type(node).__name__ == "_ShuffleDataset"
        if shuffle and tfc.shuffle_seeds(node) == (0, 0):
            return True
        inputs = tfc.dataset_inputs(node)
        node = inputs[0] if inputs else None
    return False


def reads_files(ds: tf.data.Dataset) -> bool:
    """True when the pipeline reads files, so it can be sharded by file: a
    file reader in the chain, or an interleave over a dataset of file names."""
    d = ds
    while d is not None:
        cls = type(d).__name__
        if cls in _FILE_READERS:
            return True
        if "Interleave" in cls or cls == "_FlatMapDataset":
            source = tfc.dataset_input(d)
            spec = source.element_spec if source is not None else None
            if isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string:
                return True
        d = tfc.dataset_input(d)
    return False


def chain(ds: tf.data.Dataset) -> list[tf.data.Dataset]:
    """The dataset and its inputs, as far as a single chain goes."""
    out, d = [], ds
    while d is not None:
        out.append(d)
        d = tfc.dataset_input(d)
    return out


def peekable(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds`, or where iterating it would advance its shuffle (the order
    training sees), a copy with shuffles of its own; else `ds` itself."""
    if not tfc.draws_seeds(ds):
        return ds
    try:
        return tfc.unshared_dataset(ds)
    except Exception as e:  # too large to serialise: peek at the dataset itself
        logger.debug("Peeking at the dataset itself: %s", e)
        return ds


def dataset_batch_size(ds: tf.data.Dataset) -> int | None:
    """The batch size of an already-batched dataset, or None if unbatched.

    Walks back through the transformations to the nearest batch or unbatch.
    Where the chain cannot be followed (zip, interleave...), an element whose
    leading dimensions are all unknown is taken as batched and its size read
    from the first element.
    """
    for d in chain(ds):
        if type(d).__name__ in ("_UnbatchDataset", "_RebatchDataset"):
            break
        # batch, padded_batch and parallel batch keep their size here.
        size = tfc.static_batch_size(d)
        if size is not None:
            return size
    specs = tf.nest.flatten(ds.element_spec)
    shapes = [s.shape for s in specs if hasattr(s, "shape")]
    if not shapes or any(len(s) == 0 or s[0] is not None for s in shapes):
        return None
    try:
        first = next(iter(peekable(ds).take(1)))
    except StopIteration:
        return None
    return int(tf.nest.flatten(first)[0].shape[0])


def has_map(x: Any) -> bool:
    """Whether a dataset maps a function over its elements (where a parallel
    map can matter)."""
    if not is_dataset(x):
        return False
    return any("Map" in type(d).__name__ for d in chain(x))


def is_sequential_map(node: Any) -> bool:
    """Whether one dataset of a chain is a `map` without `num_parallel_calls`
    (its class is `_MapDataset`; a parallel one's is `_ParallelMapDataset`)."""
    return type(node).__name__ == "_MapDataset"


def autotune_set(ds: tf.data.Dataset) -> bool:
    """Whether `ds`'s options set tf.data's autotuning, on or off."""
    return ds.options().autotune.enabled is not None


def sequential_map(x: Any) -> bool:
    """Whether a dataset maps a function one element at a time somewhere in
    its chain."""
    return is_dataset(x) and any(is_sequential_map(d) for d in chain(x))


def cacheable(ds: tf.data.Dataset, budget: int | None = None) -> tuple[bool, str]:
    """Whether `cache()` is safe and fits: (answer, why not)."""
    if any(type(n).__name__ in ("CacheDataset", "_CacheDataset") for n in chain(ds)):
        return False, "it is cached already"
    cardinality = int(ds.cardinality())
    if cardinality < 0:
        return False, "its length is unknown or infinite"
    if any(type(n).__name__ == "_ShuffleDataset" for n in chain(ds)):
        return False, "it shuffles (a cache would freeze one order)"
    reason = stateful_reason(ds)
    if reason:
        return False, f"{reason} (a cache would freeze their results)"
    size = 0
    batch = dataset_batch_size(ds)
    for spec in tf.nest.flatten(ds.element_spec):
        shape = getattr(spec, "shape", None)
        dtype = getattr(spec, "dtype", None)
        if shape is not None and shape.rank and shape[0] is None and batch:
            shape = tf.TensorShape([batch, *shape[1:]])  # a batch: at most this
        if shape is None or not shape.is_fully_defined() or dtype == tf.string:
            return False, "its elements have no fixed size to budget"
        size += shape.num_elements() * dtype.size
    total = size * cardinality
    if budget is None:
        available = available_bytes()
        if available is None:
            return False, "the memory available is unknown"
        budget = available // 4
    if total > budget:
        return False, f"it needs {format_bytes(total)}, over {format_bytes(budget)}"
    return True, ""


# Datasets are immutable: a pipeline's answer holds as long as the object.
_STATEFUL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stateful_reason(ds: tf.data.Dataset) -> str | None:
    """Why the pipeline's output can differ between runs or epochs: random
    ops or Python code in its functions (TensorFlow's own check), or None.

    The check serialises the pipeline's graph (50 ms for 2048 small images
    held in memory), so each dataset object is checked once."""
    try:
        return _STATEFUL[ds]
    except (KeyError, TypeError):
        pass
    reason = _stateful_reason(ds)
    with contextlib.suppress(TypeError):
        _STATEFUL[ds] = reason
    return reason


def _stateful_reason(ds: tf.data.Dataset) -> str | None:
    try:
        tfc.stateful_ops(ds)
    except tf.errors.OpError as e:
        text = first_line(e)
        # e.g. "EagerPyFunc is stateful."
        text = text.split("graph: ", 1)[-1].split(" [Op:")[0]
        return f"it has stateful operations (random ops or Python code: {text[:120]})"
    except Exception:
        return "its graph cannot be inspected"
    return None
