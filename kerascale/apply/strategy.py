"""The distribution a plan names, carried out by its backend: TensorFlow's
`tf.distribute` (`kerascale.apply.tensorflow.strategy`) or JAX's
`keras.distribution` (`kerascale.apply.jax.distribution`). This is the one
place that picks the backend's module; each function here is that module's.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from kerascale.sense import backend as backend_lib

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan


def backend_module(plan: Plan) -> ModuleType:
    """The module that carries out `plan` on its backend."""
    if plan.backend == "jax":
        from kerascale.apply.jax import distribution

        return distribution
    from kerascale.apply.tensorflow import strategy

    return strategy


def gradients_of(name: str) -> Any:
    """Backend `name`'s gradients of micro-batches, as its train step
    computes them (`kerascale.apply.gradient_noise` reads them)."""
    if name == "jax":
        from kerascale.apply.jax.gradients import gradients

        return gradients
    from kerascale.apply.tensorflow.gradients import gradients

    return gradients


def join_at_import() -> None:
    """What `import kerascale` does: joins the cluster (TensorFlow) or the
    processes (JAX) that the environment describes, on this process's
    backend; elsewhere nothing."""
    name = backend_lib.name()
    if name == "jax":
        from kerascale.apply.jax import cluster as jax_cluster

        jax_cluster.join_at_import()
    elif name == "tensorflow":
        from kerascale.apply.tensorflow import cluster

        cluster.join_at_import()


def connect_cluster(worker_timeout: float | str = 60.0, **kwargs: Any) -> Any:
    """Joins the cluster the environment describes, the backend's own way.

    On TensorFlow it builds `tf.distribute.MultiWorkerMirroredStrategy`; on
    JAX it joins `jax.distributed` (and never starts TensorFlow's runtime).
    `import kerascale` does the same already, unless `KERASCALE_AUTO_CONNECT=0`:
    call this at the top of a script that turned that off, before the model
    and the data are built. On one machine it does nothing and returns None,
    so the same script runs everywhere.

    Args:
        worker_timeout: Seconds (or "2min") a worker may stay silent before
            the others stop with `WorkerLostError`. Defaults to 60.

    Returns:
        TensorFlow: the `MultiWorkerMirroredStrategy`; JAX: a
        `keras.distribution.DataParallel` over every process's devices;
        None where the environment describes no cluster of two or more.

    Raises:
        ClusterConfigError: For a malformed TF_CONFIG, CLUSTER_SPEC, SLURM or
            JAX description (the message names the field), or when the
            backend has already started and can no longer join.
        UnsupportedError: For a parameter-server or evaluator task.

    Example:

    >>> import kerascale
    >>> kerascale.connect_cluster()   # first, before building anything
    >>> model = build_model()
    >>> kerascale.fit(model, ds, epochs=10)
    """
    name = backend_lib.name()
    if name == "jax":
        from kerascale.apply.jax import cluster as jax_cluster

        return jax_cluster.connect(worker_timeout, **kwargs)
    if name == "tensorflow":
        from kerascale.apply.tensorflow import cluster

        return cluster.connect(worker_timeout, **kwargs)
    from kerascale.errors import UnsupportedError

    raise UnsupportedError(
        f"kerascale.connect_cluster joins clusters on the TensorFlow and JAX "
        f"backends, and Keras runs on {name!r} here."
    )


def build(plan: Plan, instance: Any = None) -> Any:
    """What trains the plan's replicas: a `tf.distribute.Strategy`; on JAX a
    `keras.distribution.Distribution`, or None (Keras's default). The user's
    own `instance` is returned as it is.

    Args:
        plan: A `Plan` (its `backend`, `strategy`, `devices` and `replicas`).
        instance: The user's own strategy or distribution, or None.
    """
    return backend_module(plan).build(plan, instance)


def activated(plan: Plan, built: Any) -> Any:
    """A context manager under which Keras's `fit` trains with `built` (what
    `build` returned for `plan`): on JAX the distribution set for the run; on
    TensorFlow nothing (the model's variables carry their strategy)."""
    return backend_module(plan).activated(built)


def place(plan: Plan, built: Any, model: Any) -> Any:
    """Puts `model`'s variables where `built` trains them, where the backend
    needs it done (JAX: a model built before its distribution); returns the
    undo, or None."""
    return backend_module(plan).place(model, built)


def keep_state(plan: Plan, model: Any) -> Any:
    """Where the backend's step consumes its state (JAX donates it: after a
    failed step the model's variables are deleted), a copy of the model's
    state on the host and the function that puts it back; else None."""
    return backend_module(plan).keep_state(model)
