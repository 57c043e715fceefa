"""Every use of TensorFlow's private API, in one place.

Each function names what it reads and why there is no public way; each has a
test in tests/test_compat.py that fails when TensorFlow changes it.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

from kerascale._tf import tf

# The coordination service's key-value store (the same one TensorFlow's own
# PreemptionCheckpointHandler and MultiWorkerMirroredStrategy use) has no
# public API: tensorflow/python/eager/context.py only.
# (Module attributes read on first use: this module imports without TensorFlow.)
_KV = {
    "KV_TAKEN": ("AlreadyExistsError",),  # a key is written once
    "KV_TIMEOUT": ("DeadlineExceededError",),
    "KV_ERRORS": ("OpError",),  # the above, and a cluster that is gone
}
# Declared for type checkers only: `__getattr__` gives them.
KV_TAKEN: tuple[type[BaseException], ...]
KV_TIMEOUT: tuple[type[BaseException], ...]
KV_ERRORS: tuple[type[BaseException], ...]


def __getattr__(name: str) -> Any:
    if name in _KV:
        return tuple(getattr(tf.errors, e) for e in _KV[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def op_seeds_kept() -> Iterator[None]:
    """Puts TensorFlow's eager op-seed sequence back on exit (issue 80).

    Under a global seed, each random op or `Dataset.shuffle` made eagerly
    without its own seed draws its seed from the eager context's
    `random.Random` (`Context._rng`, read by `_internal_operation_seed` in
    tensorflow/python/eager/context.py): a measurement that makes one would
    move the seeds of the user's next ones. No public API saves the
    sequence's position (`tf.random.set_seed` restarts it). Nothing is done
    where TensorFlow is not imported (JAX without it) or no global seed is
    set (then op seeds are random anyway). A stateful random op run eagerly
    also advances the kernel TensorFlow caches for its seeds, which this
    does not undo; kerascale's measurements run none (Keras's own random
    ops on TensorFlow are stateless, seeded by its seed generator)."""
    rng, state = None, None
    if "tensorflow" in sys.modules:
        from tensorflow.python.eager import context

        rng = getattr(context.context(), "_rng", None)
        state = rng.getstate() if rng is not None else None
    try:
        yield
    finally:
        if rng is not None:
            rng.setstate(state)


def tf_started() -> bool:
    """Whether TensorFlow's runtime has started in this process (after which
    it can no longer join a cluster). No public API tells it; the eager
    context's handle is created by `context.ensure_initialized()`."""
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


def kv_set(key: str, value: str) -> None:
    """Writes `key` once in the cluster's key-value store; `KV_TAKEN` if it
    was written before."""
    from tensorflow.python.eager import context

    context.context().set_config_key_value(key, value)


# A wait for a key is cut into slices this long; between them the service is
# asked whether it lost a worker (`lost_peer`).
LOST_POLL_SECONDS = 1.0


def kv_get(key: str, timeout: float | None) -> str:
    """Waits for `key` (at most `timeout` seconds, or for ever when None);
    `KV_TIMEOUT` when it does not come in time, and the service's error for
    a worker it lost meanwhile (`lost_peer`): TensorFlow's own wait would
    outlive the worker that was to write the key."""
    from tensorflow.python.eager import context

    ctx = context.context()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = math.inf if deadline is None else deadline - time.monotonic()
        wait_ms = max(1, int(min(LOST_POLL_SECONDS, left) * 1000))
        try:
            return ctx.get_config_key_value(key, timeout_in_ms=wait_ms)
        except tf.errors.DeadlineExceededError:
            if left <= LOST_POLL_SECONDS:
                raise
        lost = lost_peer()
        if lost is not None:
            raise lost


def lost_peer() -> BaseException | None:
    """The error of the first task that TensorFlow's coordination service
    reports unhealthy (silent for its heartbeat timeout: worker_timeout), or
    None. TensorFlow's wait for a key does not end when the worker that was
    to write it dies: TF 2.21 waits out its whole timeout, and aborts only
    the collectives. The tasks' states are asked of the service
    (`get_task_states`, the eager context's, as TensorFlow's own
    ClusterCoordinator asks them) for the jobs it coordinates (its config,
    as `configure_coordination` or the strategy set it).

    None too where no coordination service runs, or where it cannot be asked
    now: that is no evidence of a lost worker (a service that is gone fails
    the wait for the key itself), and the wait then lasts as long as
    TensorFlow's own would."""
    from tensorflow.python.eager import context

    ctx = context.context()
    config = ctx.coordination_service
    if not config or not config.coordinated_job_list:
        return None
    jobs = [(job.name, job.num_tasks) for job in config.coordinated_job_list]
    try:
        states = ctx.get_task_states(jobs)
    except tf.errors.OpError:
        return None
    return next((state for state in states if state), None)


def worker_position(strategy: Any) -> tuple[int, int]:
    """(this worker's index, the number of workers) of a
    `MultiWorkerMirroredStrategy`: the public `cluster_resolver` gives the
    task type and index, but the index among training workers (the chief
    first) is only in `extended`."""
    extended = strategy.extended
    return int(extended._id_in_cluster), int(extended._num_workers)


def global_seed() -> int | None:
    """TensorFlow's global seed, or None (`tf.random.set_seed` has no getter)."""
    from tensorflow.python.framework import random_seed

    return random_seed.get_seed(None)[0]


def configure_coordination(
    cluster_spec: Any, *, heartbeat: float, start: float
) -> None:
    """Sets up TensorFlow's coordination service for `cluster_spec` with our
    timeouts (seconds), before the strategy starts it. The public strategy
    takes no heartbeat or start-up limit; this is what it calls itself
    (collective_all_reduce_strategy.py) with fixed values."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    spec = multi_worker_util.normalize_cluster_spec(cluster_spec)
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=int(heartbeat * 1000),
        cluster_register_timeout_in_ms=int(start * 1000),
        shutdown_barrier_timeout_in_ms=int(heartbeat * 1000),
        coordinated_jobs=jobs,
    )


def slurm_tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed task counts ("2(x3),1") expanded, with the parser
    TensorFlow's `SlurmClusterResolver` uses (not exported)."""
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

    return slurm_cluster_resolver.expand_tasks_per_node(text)


def unshared_dataset(ds: tf.data.Dataset) -> tf.data.Dataset:
    """A copy of `ds` whose shuffles (and `Dataset.random`s) draw from seed
    generators of their own, started from the same seeds: iterating it does
    not change the order `ds` gives its next iterator.

    Every new iterator of `ds.shuffle(..., seed=s)` (reshuffle_each_iteration,
    the default) takes the next seeds from a generator the dataset owns, so
    a measurement that iterated the user's dataset would shift the orders of
    their training's epochs (tensorflow#58925: no API resets or copies that
    state). No public API copies a dataset either: its graph is serialized
    (`_as_serialized_graph`), each seed-generator handle in it is replaced by
    a `DummySeedGenerator` op (for which the kernel makes a fresh generator
    from the op's seeds), and the graph is read back (`DatasetFromGraph`,
    `_VariantDataset`). The data a dataset holds in memory is copied too.

    Raises:
        Whatever serializing raises (a graph over protobuf's 2 GiB).
    """
    from tensorflow.python.data.ops import dataset_ops

    graph = dataset_graph(ds)
    for node in graph.node:
        value = node.attr["value"].tensor if "value" in node.attr else None
        handles = value.resource_handle_val if value is not None else ()
        if node.op == "Const" and any(
            h.maybe_type_name.endswith("SeedGeneratorE") for h in handles
        ):
            node.op = "DummySeedGenerator"
            node.attr.clear()
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
    return dataset_ops._VariantDataset(variant, ds.element_spec)


def dataset_graph(ds: tf.data.Dataset) -> Any:
    """The `GraphDef` of `ds`'s pipeline (`_as_serialized_graph`; no public
    API serializes a dataset), stateful ops kept with a warning."""
    from tensorflow.core.framework import graph_pb2

    policy = tf.data.experimental.ExternalStatePolicy.WARN
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    return graph


# The datasets that take seeds from a generator of their own at each new
# iterator (their class names in tensorflow/python/data/ops).
_SEED_DRAWING = ("_ShuffleDataset", "RandomDataset", "_RandomDataset")


def draws_seeds(ds: tf.data.Dataset) -> bool:
    """Whether iterating `ds` advances a seed generator it holds (a shuffle
    or `Dataset.random` anywhere among its inputs). Walks `_inputs()`, the
    private list every dataset keeps of the datasets it reads (zip and
    concatenate included); where that fails, True."""
    return seed_drawers(ds) > 0


def seed_drawers(ds: tf.data.Dataset) -> int:
    """How many of `ds`'s datasets (itself and its inputs) draw seeds from a
    generator of their own (`draws_seeds`); where the walk fails, 1."""
    seen, todo, found = set(), [ds], 0
    try:
        while todo:
            d = todo.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            found += type(d).__name__ in _SEED_DRAWING
            todo.extend(d._inputs())
    except Exception:  # a private structure changed: assume it does
        return max(found, 1)
    return found


# A tf.data pipeline's structure, as its Python objects hold it. No public API
# walks a pipeline (tensorflow/tensorflow#37517, a proposal to expose it, was
# closed): each reader below returns "nothing known" where the attribute is
# missing, and tests/test_compat.py checks each against this TensorFlow.


def dataset_input(ds: Any) -> Any:
    """The dataset a one-input transformation reads (`_input_dataset`), or None."""
    return getattr(ds, "_input_dataset", None)


def dataset_inputs(ds: Any) -> list[Any]:
    """Every dataset `ds` reads (`_inputs()`: zip's and concatenate's too)."""
    try:
        return list(ds._inputs())
    except Exception:  # a private structure changed: nothing known
        return []


def static_batch_size(ds: Any) -> int | None:
    """The batch size a batch, padded_batch or rebatch node was given, when
    it is a constant above 0 (`_batch_size`)."""
    size = getattr(ds, "_batch_size", None)
    value = tf.get_static_value(size) if size is not None else None
    return int(value) if value is not None and int(value) > 0 else None


def shuffle_seeds(ds: Any) -> tuple[int, int] | None:
    """(seed, seed2) of a shuffle node (`_seed`, `_seed2`; both 0 when it
    has neither an op seed nor a global one), or None."""
    try:
        return int(ds._seed), int(ds._seed2)
    except (AttributeError, TypeError, ValueError):
        return None


def dataset_functions(ds: Any) -> list[Any]:
    """The traced functions a node applies (`_map_func`, `_predicate`):
    `StructuredFunctionWrapper`s, whose `.function` is a concrete function."""
    return [
        getattr(ds, name)
        for name in ("_map_func", "_predicate")
        if getattr(ds, name, None) is not None
    ]


def stateful_ops(ds: tf.data.Dataset) -> None:
    """Raises `tf.errors.OpError` naming the first stateful op of `ds`'s
    graph (random ops, Python code), if it has one: serialising with
    external_state_policy=FAIL is the only check, and it needs the dataset's
    variant tensor (`_variant_tensor`)."""
    tf.raw_ops.DatasetToGraphV2(
        input_dataset=ds._variant_tensor, external_state_policy=2
    )  # 2: FAIL


def reapply_map(
    ds: tf.data.Dataset, wrapper: Any, *, filter: bool = False, **map_kwargs: Any
) -> Any:
    """`ds.map` of an already traced map function (`wrapper`, from
    `dataset_functions`), with new `map_kwargs` (num_parallel_calls): the
    flat tensors in and out, packed by `tensorflow.python.data.util.structure`
    as the original map did. With `filter`, `ds.filter` of a traced
    predicate."""
    from tensorflow.python.data.util import structure

    spec = ds.element_spec

    @tf.autograph.experimental.do_not_convert
    def call(*args):
        element = args[0] if len(args) == 1 else args
        flat = structure.to_tensor_list(spec, element)
        result = wrapper.function(*flat)
        return structure.from_compatible_tensor_list(wrapper.output_structure, result)

    if filter:
        return ds.filter(call)
    return ds.map(call, **map_kwargs)


class NotReplayable(Exception):
    """A transformation `replay` cannot apply again; its message names it."""


def _deterministic(node: Any) -> bool | None:
    """A parallel node's `deterministic=` argument (`_deterministic`:
    "default", "true" or "false")."""
    return {"true": True, "false": False}.get(str(getattr(node, "_deterministic", "")))


def replay(node: Any, ds: tf.data.Dataset) -> tf.data.Dataset:
    """`node`'s transformation applied to `ds` instead of its own input,
    through the public method that made it, from the arguments the node
    keeps (`_buffer_size`, `_reshuffle_each_iteration`, `_drop_remainder`,
    `_count`, `_options_attr`, the traced functions): a map, filter,
    shuffle, batch, prefetch, repeat or `with_options`. No public API
    re-applies a pipeline's steps to another input (tensorflow#37517).

    A shuffle keeps its op seed (`seed2`): under the same global seed it
    shuffles as the original did.

    Raises:
        NotReplayable: For any other transformation, or a changed structure.
    """
    name = type(node).__name__
    try:
        if name in ("_MapDataset", "_ParallelMapDataset"):
            (wrapper,) = dataset_functions(node)
            parallel = {}
            if name == "_ParallelMapDataset":
                parallel = dict(
                    num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=_deterministic(node),
                )
            return reapply_map(ds, wrapper, **parallel)
        if name == "_FilterDataset":
            (wrapper,) = dataset_functions(node)
            return reapply_map(ds, wrapper, filter=True)
        if name == "_ShuffleDataset":
            _, seed2 = shuffle_seeds(node) or (0, 0)
            return ds.shuffle(
                int(node._buffer_size),
                seed=seed2 or None,
                reshuffle_each_iteration=bool(node._reshuffle_each_iteration),
            )
        if name in ("_BatchDataset", "_ParallelBatchDataset"):
            size = static_batch_size(node)
            if size is None:
                raise NotReplayable(f"{name} of a batch size set at run time")
            drop = bool(tf.get_static_value(node._drop_remainder))
            parallel = {}
            if name == "_ParallelBatchDataset":
                parallel = dict(
                    num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=_deterministic(node),
                )
            return ds.batch(size, drop_remainder=drop, **parallel)
        if name == "_PrefetchDataset":
            return ds.prefetch(int(node._buffer_size))
        if name == "_RepeatDataset":
            count = int(node._count)
            return ds.repeat(None if count < 0 else count)
        if name == "_OptionsDataset":
            return ds.with_options(node._options_attr)
    except NotReplayable:
        raise
    except Exception as e:  # a private structure changed
        raise NotReplayable(f"{name} ({type(e).__name__}: {e})") from e
    raise NotReplayable(name)


def iterator_dataset(iterator: Any) -> Any:
    """The dataset a `tf.data` iterator reads (`OwnedIterator._dataset`;
    none public), or None: its cardinality tells when an epoch is used up."""
    return getattr(iterator, "_dataset", None)


# An asynchronous save's snapshot, written in TensorFlow's checkpoint format
# from another thread. tf.train.CheckpointOptions(enable_async=True) copies
# and writes behind training too, but binds its host copies to one
# tf.train.Checkpoint of fixed objects, and Keras makes a new iterator each
# epoch; nor does it let the commit (hashes, fsync, the atomic rename) wait
# for its write. The Trackable protocol's `_serialize_to_tensors` (what a
# checkpoint write calls on each object; private) is the way in: the
# iterator's state is taken by it at the save, and the write reads each
# object's values from a stand-in that answers it with the snapshot's copy,
# under the original's legacy saveable name where it has one (a tf.data
# iterator's keys are "ITERATOR_STATE", not "_STATE":
# tensorflow/python/checkpoint/saveable_compat.py). The checkpoint's keys and
# object graph are those of a write of the real objects (tests/test_compat.py
# reads one into them).
_VARIABLE_VALUE = "VARIABLE_VALUE"  # tensorflow/python/trackable/base.py
_LEGACY_NAME = "_LEGACY_SAVEABLE_NAME"  # saveable_compat.legacy_saveable_name


class FrozenState:
    """An object's checkpoint tensors, taken at one moment."""

    def __init__(self, tensors: dict[str, Any], legacy_name: str | None = None):
        self.tensors, self.legacy_name = tensors, legacy_name


def iterator_state(iterator: Any) -> FrozenState:
    """A `tf.data` iterator's state now, as its checkpoint write takes it
    (`OwnedIterator._serialize_to_tensors`: the serialized iterator, shuffle
    buffers included, a value that later steps do not change)."""
    return FrozenState(
        dict(iterator._serialize_to_tensors()), getattr(iterator, _LEGACY_NAME, None)
    )


# Where a reshuffling dataset's iterator writes its seed generator's count
# (what orders the iterators made after it), one key per such dataset
# (tensorflow/core/kernels/data/shuffle_dataset_op.cc, random_seed_ops.cc).
# An iterator whose input ran out writes nothing of that input: a prefetch
# that read ahead to an epoch's end drops the shuffle's count with it.
_SEED_COUNT_KEY = b"epoch_num_random_samples"


def keeps_seeds(state: FrozenState, drawers: int) -> bool:
    """Whether an iterator's `iterator_state` still holds the seed counts of
    its pipeline's `drawers` seed-drawing datasets (`seed_drawers`): False
    where one of them ran out under a read-ahead, and the iterators made
    after it would take other seeds on a resume. Reads the serialized
    state's keys (no public API lists them): one part a dataset's iterator,
    a parent's before its inputs', a shuffle's counts before its buffer, so
    the read stops before the buffer where the counts are there."""
    if drawers <= 0:
        return True
    found = 0
    for value in state.tensors.values():
        parts = [value] if value.shape.rank == 0 else value
        for part in parts:
            found += tf.io.serialize_tensor(part).numpy().count(_SEED_COUNT_KEY)
            if found >= drawers:
                return True
    return False


def frozen(state: FrozenState) -> Any:
    """A trackable that a checkpoint writes as the object `state` was taken
    from (`tf.train.Checkpoint(name=frozen(state))`)."""

    class Frozen(tf.__internal__.tracking.Trackable):
        def __init__(self, state: FrozenState):
            self._tensors = state.tensors
            if state.legacy_name is not None:
                setattr(self, _LEGACY_NAME, state.legacy_name)

        def _serialize_to_tensors(self) -> dict[str, Any]:
            return self._tensors

    return Frozen(state)


def write_frozen(
    prefix: str, groups: dict[str, list[Any]], iterator: FrozenState | None
) -> None:
    """Writes a TensorFlow checkpoint under `prefix` of `groups`' values
    (NumPy arrays, in each group's variables' order) and an iterator's
    `iterator_state`, as `tf.train.Checkpoint(**objects).write(prefix)` of
    the objects they were taken from writes it."""
    objects: dict[str, Any] = {
        group: [
            frozen(FrozenState({_VARIABLE_VALUE: tf.convert_to_tensor(v)}))
            for v in values
        ]
        for group, values in groups.items()
    }
    if iterator is not None:
        objects["iterator"] = frozen(iterator)
    tf.train.Checkpoint(**objects).write(prefix)
