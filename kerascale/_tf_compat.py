"""Every use of TensorFlow's private API, in one place.

Each function names what it reads and why there is no public way; each has a
test in tests/test_compat.py that fails when TensorFlow changes it.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

# The coordination service's key-value store (the same one TensorFlow's own
# PreemptionCheckpointHandler and MultiWorkerMirroredStrategy use) has no
# public API: tensorflow/python/eager/context.py only.
KV_TAKEN = (tf.errors.AlreadyExistsError,)  # a key is written once
KV_TIMEOUT = (tf.errors.DeadlineExceededError,)
KV_ERRORS = (tf.errors.OpError,)  # the above, and a cluster that is gone


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


def kv_get(key: str, timeout: float | None) -> str:
    """Waits for `key` (at most `timeout` seconds, or for ever when None);
    `KV_TIMEOUT` when it does not come in time."""
    from tensorflow.python.eager import context

    # TensorFlow reads a timeout of 0 as "wait for ever".
    ms = 0 if timeout is None else max(1, int(timeout * 1000))
    return context.context().get_config_key_value(key, timeout_in_ms=ms)


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
