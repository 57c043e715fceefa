"""Shaping the training data to the plan.

`prepare` batches or re-batches a dataset to the plan's per-step batch and
applies the safe input-pipeline optimisations (parallel maps, a safe cache,
prefetch, sharding across workers). Arrays are left to Keras, whose own
adapter already batches, shuffles and prefetches them. `optimize` is the same
pipeline changes on their own, for users of plain `model.fit`
(`kerascale.data.optimize`).
"""

from __future__ import annotations

import logging
from typing import Any

import keras

from kerascale import _tf_compat as tfc
from kerascale import _validation
from kerascale._tf import tf
from kerascale._units import parse_bytes
from kerascale.errors import DataError
from kerascale.plan.data_changes import AUTOTUNE_OFF
from kerascale.plan.plan import Plan
from kerascale.sense.data_facts import (
    DataFacts,
    autotune_set,
    cacheable,
    chain,
    inspect,
    is_dataset,
    is_sequential_map,
    leading_dims,
    sequential_map,
)

logger = logging.getLogger("kerascale")


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
    maps, base = [], ds
    while is_sequential_map(base):
        maps.append(base)
        base = tfc.dataset_input(base)
    if not maps:
        return ds
    try:
        out = base
        for m in reversed(maps):
            (wrapper,) = tfc.dataset_functions(m)
            out = tfc.reapply_map(out, wrapper, num_parallel_calls=tf.data.AUTOTUNE)
        if out.element_spec != ds.element_spec:
            return ds
        return out
    except Exception as e:  # a private structure changed: keep the user's
        logger.debug("Maps not parallelised: %s", e)
        return ds


def prepare(
    ds: tf.data.Dataset,
    facts: DataFacts,
    plan: Plan,
    *,
    optimize: bool,
    read_in_part: bool = False,
):
    """Batches a dataset to the plan's per-step batch and optimises it.

    The per-step batch is `plan.step_batch_size` (micro-batch x replicas): the
    strategy splits it across replicas. `read_in_part`: it is read for
    some steps of its first epoch only (the host share's reading,
    `diagnose`'s rates), so it is not cached: TensorFlow throws away a
    cache() read in part, with a warning the user would read as theirs, and
    such a reading never reaches the epochs where it pays. (The trials keep
    the cache: they read whole epochs.)
    """
    batch = plan.step_batch_size
    if optimize:
        ds = parallel_maps(ds)
    if not facts.batched:
        ds = ds.batch(batch)
    elif facts.batch_size != batch:
        ds = rebatch(ds, batch)
    if optimize:
        cache = facts.cacheable and not read_in_part
        autotune_off = not facts.autotune_set
        ds, _ = _finish(ds, cache=cache, deterministic=None, autotune_off=autotune_off)
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


def rebatch(ds: tf.data.Dataset, batch: int) -> tf.data.Dataset:
    """`ds.rebatch(batch)`, with its length kept known where the samples
    behind it can be counted: Keras creates one iterator more per epoch for a
    dataset of known length, and each draws a shuffle's seed, so a length
    lost would shuffle the epochs after the first unlike a plain `fit`."""
    out = ds.rebatch(batch)
    samples = _batched_samples(ds)
    if samples is None or int(out.cardinality()) >= 0:
        return out
    return out.apply(tf.data.experimental.assert_cardinality(-(-samples // batch)))


def _batched_samples(ds: tf.data.Dataset) -> int | None:
    """How many samples the batches of `ds` hold, where its nearest batch
    node reads a dataset of known length and nothing after it changes the
    number of batches; else None."""
    batches = int(ds.cardinality())
    if batches < 0:
        return None
    for node in chain(ds):
        size = tfc.static_batch_size(node)
        if size is None:
            continue
        source = tfc.dataset_input(node)
        n = int(source.cardinality()) if source is not None else -1
        drop = tf.get_static_value(getattr(node, "_drop_remainder", None))
        if n < 0 or drop is None or type(node).__name__ != "_BatchDataset":
            return None
        if drop:
            n -= n % size
        return n if -(-n // size) == batches == int(node.cardinality()) else None
    return None


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
    - tf.data's autotuning off, unless `ds`'s options set it: parallel
      calls at the cores (up to 16), and no wait when an iterator of it is
      dropped (Keras drops one each epoch).
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
    out, more = _finish(
        parallel,
        cache=bool(cache),
        deterministic=deterministic,
        autotune_off=not autotune_set(ds),
    )
    return out, changes + more


def _finish(
    ds: tf.data.Dataset, *, cache: bool, deterministic: bool | None, autotune_off: bool
) -> tuple[tf.data.Dataset, list[str]]:
    """Caches, sets the options and prefetches the top of a pipeline.

    `autotune_off`: tf.data's autotuning is turned off. Its parallel calls
    then run at the cores (up to 16, where `AUTOTUNE` starts: TensorFlow's
    `GetAutotuneDefaultParallelism`), and a prefetch of `AUTOTUNE` still
    grows its buffer whenever it runs dry (its own tuner, not autotuning's).
    What it spares: dropping an iterator waits for the autotuning thread,
    the longer the iterator lived. On TensorFlow 2.21, an iterator that
    lived 30 or 60 s took 11 and 22 s to drop in some runs, at the same
    speed with it off and 0.2 s to drop; Keras drops one each epoch, and
    one at the end of `fit` (28.8 s at the end of a 5-minute run). Found by
    experiment (benchmarks/README.md, "tf.data's autotuning"); no upstream
    issue found.
    """
    changes = []
    if cache and not caches(ds):
        ds = ds.cache()
        changes.append("cache()")
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = True
    if autotune_off:
        options.autotune.enabled = False
        changes.append(AUTOTUNE_OFF)
    if deterministic is not None:
        options.deterministic = deterministic
        if not deterministic:
            changes.append("order not kept (deterministic=False)")
    ds = ds.with_options(options)
    if sequential_map(ds):
        changes.append("map parallelization")
    if not any(type(n).__name__ == "_PrefetchDataset" for n in chain(ds)[:2]):
        ds = ds.prefetch(tf.data.AUTOTUNE)
        changes.append("prefetch(AUTOTUNE)")
    return ds, changes


def caches(x: Any) -> bool:
    """Whether `x` is a `tf.data.Dataset` with a `cache()` in its chain."""
    return is_dataset(x) and any(
        type(n).__name__ in ("CacheDataset", "_CacheDataset") for n in chain(x)
    )


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
) -> tuple[Any, int | None]:
    """Validates `validation_data` and batches a dataset like the training data.

    Arrays given as `(x, y)` or `(x, y, sample_weight)` are returned as they are:
    Keras batches them with the training batch size.

    Returns:
        (the validation data for Keras, the batch `validation_steps` counts
        in Keras's meaning for it: a batched dataset's own batch, else
        `batch_size`, the plan's global batch; None for a PyDataset).
    """
    if validation_data is None:
        return None, None
    if is_dataset(validation_data):
        facts = inspect(
            validation_data,
            name="validation_data",
            steps_per_epoch=validation_steps,
            steps_name="validation_steps",
        )
        own = facts.batch_size if facts.batched else plan.global_batch_size
        return prepare(validation_data, facts, plan, optimize=optimize), own
    if isinstance(validation_data, keras.utils.PyDataset):
        inspect(validation_data, name="validation_data")
        return validation_data, None
    if isinstance(validation_data, tuple | list) and len(validation_data) in (2, 3):
        vx, vy = validation_data[0], validation_data[1]
        inspect(vx, vy, name="validation_data")
        if len(validation_data) == 3 and validation_data[2] is not None:
            (n,) = set(leading_dims(vx))
            if set(leading_dims(validation_data[2])) != {n}:
                raise DataError(
                    "validation_data's sample_weight must have one entry per "
                    f"sample ({n})."
                )
        return validation_data, plan.global_batch_size
    # A generator, a grain or torch loader...: Keras reads it as it is (and
    # raises its own error for what it cannot read).
    return validation_data, None
