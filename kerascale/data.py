"""Training data: what it is, and shaping it to the plan.

`inspect` learns the facts planning needs (a dataset or arrays, batched or
not, the user's own batch size) and rejects data that cannot train with a
clear error. `prepare` batches or re-batches a dataset to the plan's batch and
applies the safe input-pipeline optimisations. Arrays are left to Keras, whose
own adapter already batches, shuffles and prefetches them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kerascale import _validation
from kerascale.errors import DataError
from kerascale.memory import parse_bytes
from kerascale.planning import DataFacts, Plan

logger = logging.getLogger("kerascale")


def is_dataset(x: Any) -> bool:
    return isinstance(x, tf.data.Dataset)


def _leading_dims(structure: Any) -> list[int]:
    dims = []
    for a in tf.nest.flatten(structure):
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


def _array_like(x: Any) -> bool:
    return all(
        isinstance(a, np.ndarray | tf.Tensor | list | tuple) or hasattr(a, "__array__")
        for a in tf.nest.flatten(x)
    )


def inspect(
    x: Any,
    y: Any = None,
    *,
    steps_per_epoch: Any = None,
    name: str = "x",
    steps_name: str = "steps_per_epoch",
) -> DataFacts:
    """Learns what planning needs to know about `x`/`y`, validating them.

    Args:
        x: A `tf.data.Dataset` (batched or not, yielding `(x, y)` or
            `(x, y, sample_weight)`), or arrays (NumPy, tensors, or a dict or
            list of them).
        y: Targets when `x` is arrays; must be None for a dataset.
        steps_per_epoch: Needed when the dataset is infinite.
        name: How to name `x` in errors (e.g. "validation_data").
        steps_name: How to name `steps_per_epoch` in errors.

    Raises:
        DataError: For empty data, an infinite dataset without
            `steps_per_epoch`, mismatched lengths or an unsupported type.
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
    if isinstance(x, Mapping) or _array_like(x):
        return _inspect_arrays(x, y, name=name)
    raise DataError(
        f"{name} must be a tf.data.Dataset, a keras.utils.PyDataset or arrays "
        "(NumPy, tensors, or a dict or list of them). Received: "
        f"{name} of type {type(x).__name__}. Wrap a Python generator with "
        "tf.data.Dataset.from_generator(gen, output_signature=...) so that "
        "kerascale can batch it and every epoch can read it again."
    )


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
    (batch, *_) = _leading_dims(inputs)
    return DataFacts(kind="pydataset", batched=True, batch_size=batch)


def _inspect_arrays(x: Any, y: Any, *, name: str) -> DataFacts:
    x_dims = _leading_dims(x)
    if not x_dims:
        raise DataError(f"{name} holds no arrays. Received: {name}={x!r}")
    lengths = {f"{name}": set(x_dims)}
    if y is not None:
        lengths["y"] = set(_leading_dims(y))
    if len(set(x_dims)) > 1:
        raise DataError(
            f"All arrays in {name} must have the same number of samples. "
            f"Received lengths: {sorted(set(x_dims))}"
        )
    n = x_dims[0]
    if y is not None and lengths["y"] != {n}:
        raise DataError(
            f"{name} and y must have the same number of samples. Received: "
            f"{name} has {n}, y has {sorted(lengths['y'])}"
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
    return DataFacts(
        kind="dataset",
        batched=batch is not None,
        batch_size=batch,
        num_samples=samples,
        from_files=reads_files(ds),
        cacheable=cacheable(ds)[0],
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
        if type(node).__name__ == "_ShuffleDataset":
            try:
                if int(node._seed) == 0 and int(node._seed2) == 0:
                    return True
            except (AttributeError, TypeError, ValueError):
                pass
        inputs = node._inputs() if hasattr(node, "_inputs") else []
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
            source = d._input_dataset
            spec = source.element_spec
            if isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string:
                return True
        d = getattr(d, "_input_dataset", None)
    return False


def _chain(ds: tf.data.Dataset) -> list[tf.data.Dataset]:
    """The dataset and its inputs, as far as a single chain goes."""
    out, d = [], ds
    while d is not None:
        out.append(d)
        d = getattr(d, "_input_dataset", None)
    return out


def dataset_batch_size(ds: tf.data.Dataset) -> int | None:
    """The batch size of an already-batched dataset, or None if unbatched.

    Walks back through the transformations to the nearest batch or unbatch.
    Where the chain cannot be followed (zip, interleave...), an element whose
    leading dimensions are all unknown is taken as batched and its size read
    from the first element.
    """
    for d in _chain(ds):
        if type(d).__name__ in ("_UnbatchDataset", "_RebatchDataset"):
            break
        # batch, padded_batch and parallel batch keep their size here.
        size = getattr(d, "_batch_size", None)
        if size is not None:
            value = tf.get_static_value(size)
            if value is not None and int(value) > 0:
                return int(value)
    specs = tf.nest.flatten(ds.element_spec)
    shapes = [s.shape for s in specs if hasattr(s, "shape")]
    if not shapes or any(len(s) == 0 or s[0] is not None for s in shapes):
        return None
    try:
        first = next(iter(ds.take(1)))
    except StopIteration:
        return None
    return int(tf.nest.flatten(first)[0].shape[0])


def has_map(x: Any) -> bool:
    """Whether a dataset maps a function over its elements (where a parallel
    map can matter)."""
    if not isinstance(x, tf.data.Dataset):
        return False
    return any("Map" in type(d).__name__ for d in _chain(x))


def signature(x: Any) -> str:
    """What identifies the training data for caching a measured decision:
    the element structure and the chain of transformations (not the values)."""
    if isinstance(x, tf.data.Dataset):
        names = [type(d).__name__ for d in _chain(x)]
        return repr((names, x.element_spec))
    leaves = tf.nest.flatten(x)
    return repr(
        [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for a in leaves]
    )


def parallel_maps(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with the sequential maps at the top of its chain run in parallel
    (`num_parallel_calls=AUTOTUNE`, output order kept).

    TensorFlow's own `map_parallelization` optimisation leaves a map alone
    when its function is stateful, which every random augmentation
    (`tf.image.random_flip_left_right`...) is; these are the maps that cost
    the most. The traced function is re-applied as it is: the same
    computation, with random draws taken in a different order. Anything
    unexpected leaves `ds` unchanged.
    """
    from tensorflow.python.data.util import structure

    maps, base = [], ds
    while type(base).__name__ == "_MapDataset":
        maps.append(base)
        base = base._input_dataset
    if not maps:
        return ds
    try:
        out = base
        for m in reversed(maps):
            wrapper = m._map_func

            @tf.autograph.experimental.do_not_convert
            def call(*args, wrapper=wrapper, spec=out.element_spec):
                element = args[0] if len(args) == 1 else args
                flat = structure.to_tensor_list(spec, element)
                result = wrapper.function(*flat)
                return structure.from_compatible_tensor_list(
                    wrapper.output_structure, result
                )

            out = out.map(call, num_parallel_calls=tf.data.AUTOTUNE)
        if out.element_spec != ds.element_spec:
            return ds
        return out
    except Exception as e:  # a private structure changed: keep the user's
        logger.debug("Maps not parallelised: %s", e)
        return ds


def prepare(ds: tf.data.Dataset, facts: DataFacts, plan: Plan, *, optimize: bool):
    """Batches a dataset to the plan's per-step batch and optimises it.

    The per-step batch is `plan.step_batch_size` (micro-batch x replicas): the
    strategy splits it across replicas.
    """
    batch = plan.step_batch_size
    if optimize:
        ds = parallel_maps(ds)
    if not facts.batched:
        ds = ds.batch(batch)
    elif facts.batch_size != batch:
        ds = ds.rebatch(batch)
    if optimize:
        ds, _ = _finish(ds, cache=facts.cacheable, deterministic=None)
        if plan.replicas > 1:
            options = tf.data.Options()
            policy = tf.data.experimental.AutoShardPolicy
            # AUTO shards by file and falls back to data when there are
            # fewer files than workers (FILE alone would fail there).
            options.experimental_distribute.auto_shard_policy = (
                policy.AUTO if facts.from_files else policy.DATA
            )
            ds = ds.with_options(options)
    return ds


def optimize(
    ds: tf.data.Dataset,
    *,
    deterministic: bool = True,
    cache: bool | str = "auto",
    memory_budget: int | str | None = None,
) -> tf.data.Dataset:
    """Applies the input-pipeline fixes that cannot change what is trained.

    - The maps you applied last run in parallel (`num_parallel_calls=
      AUTOTUNE`), random augmentations and Python functions included, which
      TensorFlow's own `map_parallelization` leaves sequential; TensorFlow's
      map parallelisation for the rest.
    - `cache()` when every epoch yields the same elements (no shuffle, no
      random or Python ops), the length is known, and the size, from the
      element shapes, fits in `memory_budget`.
    - `prefetch(AUTOTUNE)` at the end.
    - The order of elements is kept unless `deterministic=False`.

    What it changed is logged, and returned by `optimize_report`.

    Args:
        ds: A `tf.data.Dataset`.
        deterministic: Keep the order of elements. Defaults to True.
        cache: True, False, or "auto" (see above). Defaults to "auto".
        memory_budget: Bytes or "2GiB" a cache may take. Defaults to `None`:
            a quarter of the memory available now.

    Returns:
        The optimised dataset.

    Example:

    >>> ds = kerascale.data.optimize(ds)
    """
    ds, changes = _optimize(ds, deterministic, cache, memory_budget)
    logger.info("data.optimize: %s", ", ".join(changes) or "nothing to change")
    return ds


def optimize_report(
    ds: tf.data.Dataset,
    *,
    deterministic: bool = True,
    cache: bool | str = "auto",
    memory_budget: int | str | None = None,
) -> list[str]:
    """What `optimize` would change, in words, without changing anything."""
    return _optimize(ds, deterministic, cache, memory_budget)[1]


def _optimize(
    ds: Any, deterministic: Any, cache: Any, memory_budget: Any
) -> tuple[tf.data.Dataset, list[str]]:
    if not is_dataset(ds):
        raise _validation.fail("ds", type(ds).__name__, "a tf.data.Dataset")
    _validation.boolean("deterministic", deterministic)
    _validation.boolean_or_auto("cache", cache)
    budget = (
        None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
    )
    changes = []
    parallel = parallel_maps(ds)
    if parallel is not ds:
        changes.append("parallel maps")
    if cache == "auto":
        cache, why = cacheable(ds, budget)
        if not cache:
            changes.append(f"no cache(): {why}")
    elif cache:
        changes.append("cache() (as asked)")
    out, more = _finish(parallel, cache=bool(cache), deterministic=deterministic)
    return out, changes + more


def _finish(
    ds: tf.data.Dataset, *, cache: bool, deterministic: bool | None
) -> tuple[tf.data.Dataset, list[str]]:
    """Caches, sets the options and prefetches the top of a pipeline."""
    changes = []
    if cache and not any(
        type(n).__name__ in ("CacheDataset", "_CacheDataset") for n in _chain(ds)
    ):
        ds = ds.cache()
        changes.append("cache()")
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = True
    if deterministic is not None:
        options.deterministic = deterministic
        if not deterministic:
            changes.append("order not kept (deterministic=False)")
    ds = ds.with_options(options)
    changes.append("map parallelization")
    if not any(type(n).__name__ == "_PrefetchDataset" for n in _chain(ds)[:2]):
        ds = ds.prefetch(tf.data.AUTOTUNE)
        changes.append("prefetch(AUTOTUNE)")
    return ds, changes


def cacheable(ds: tf.data.Dataset, budget: int | None = None) -> tuple[bool, str]:
    """Whether `cache()` is safe and fits: (answer, why not)."""
    from kerascale.memory import available_bytes, format_bytes

    if any(type(n).__name__ in ("CacheDataset", "_CacheDataset") for n in _chain(ds)):
        return False, "it is cached already"
    cardinality = int(ds.cardinality())
    if cardinality < 0:
        return False, "its length is unknown or infinite"
    if any(type(n).__name__ == "_ShuffleDataset" for n in _chain(ds)):
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


def stateful_reason(ds: tf.data.Dataset) -> str | None:
    """Why the pipeline's output can differ between runs or epochs: random
    ops or Python code in its functions (TensorFlow's own check), or None."""
    try:
        tf.raw_ops.DatasetToGraphV2(
            input_dataset=ds._variant_tensor,
            external_state_policy=2,  # FAIL
        )
    except tf.errors.OpError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # e.g. "EagerPyFunc is stateful."
        text = text.split("graph: ", 1)[-1].split(" [Op:")[0]
        return f"it has stateful operations (random ops or Python code: {text[:120]})"
    except Exception:
        return "its graph cannot be inspected"
    return None


def lost_cardinality(original: tf.data.Dataset, prepared: tf.data.Dataset) -> bool:
    """True when re-batching made a dataset of known length unknown: Keras then
    warns at the end of the first epoch that the input "ran out of data",
    which here is the normal end of an epoch."""
    unknown = tf.data.UNKNOWN_CARDINALITY
    return int(original.cardinality()) >= 0 and int(prepared.cardinality()) == unknown


def prepare_validation(
    validation_data: Any,
    plan: Plan,
    *,
    optimize: bool,
    validation_steps: Any = None,
) -> Any:
    """Validates `validation_data` and batches a dataset like the training data.

    Arrays given as `(x, y)` or `(x, y, sample_weight)` are returned as they are:
    Keras batches them with the training batch size.
    """
    if validation_data is None:
        return None
    if is_dataset(validation_data):
        facts = inspect(
            validation_data,
            name="validation_data",
            steps_per_epoch=validation_steps,
            steps_name="validation_steps",
        )
        return prepare(validation_data, facts, plan, optimize=optimize)
    if isinstance(validation_data, keras.utils.PyDataset):
        inspect(validation_data, name="validation_data")
        return validation_data
    if isinstance(validation_data, tuple | list) and len(validation_data) in (2, 3):
        vx, vy = validation_data[0], validation_data[1]
        inspect(vx, vy, name="validation_data")
        if len(validation_data) == 3 and validation_data[2] is not None:
            (n,) = set(_leading_dims(vx))
            if set(_leading_dims(validation_data[2])) != {n}:
                raise DataError(
                    "validation_data's sample_weight must have one entry per "
                    f"sample ({n})."
                )
        return validation_data
    raise DataError(
        "validation_data must be a tf.data.Dataset, a keras.utils.PyDataset, or "
        "a tuple (x, y) or (x, y, sample_weight). Received: validation_data of "
        "type "
        f"{type(validation_data).__name__}"
    )


def sample_inputs(x: Any, facts: DataFacts) -> Any:
    """A one-sample batch of inputs, to build an unbuilt model."""
    if facts.kind == "arrays":
        return tf.nest.map_structure(lambda a: np.asarray(a)[:1], x)
    if facts.kind == "pydataset":
        first = x[0]
        inputs = first[0] if isinstance(first, tuple) else first
        return tf.nest.map_structure(lambda a: np.asarray(a)[:1], inputs)
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
    largest = [list(s.shape) for s in flat]
    for item in ds.take(scan):
        for i, t in enumerate(tf.nest.flatten(item)):
            largest[i] = [
                max(d or 0, n) for d, n in zip(largest[i], t.shape, strict=True)
            ]
    return tf.nest.pack_sequence_as(
        element,
        [
            tf.TensorSpec([max(1, d or 1) for d in dims], s.dtype)
            for dims, s in zip(largest, flat, strict=True)
        ],
    )
