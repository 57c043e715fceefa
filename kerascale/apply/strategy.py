"""The distribution a plan names, carried out by its backend: TensorFlow's
`tf.distribute` (`kerascale.apply.tensorflow.strategy`) or JAX's
`keras.distribution` (`kerascale.apply.jax.distribution`). This is the one
place that picks the backend's module; each function here is that module's.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kerascale.sense import backend as backend_lib


def backend_module(plan: Any) -> ModuleType:
    """The module that carries out `plan` on its backend."""
    if plan.backend == "jax":
        from kerascale.apply.jax import distribution

        return distribution
    from kerascale.apply.tensorflow import strategy

    return strategy


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


def build(plan: Any, instance: Any = None) -> Any:
    """What trains the plan's replicas: a `tf.distribute.Strategy`; on JAX a
    `keras.distribution.Distribution`, or None (Keras's default). The user's
    own `instance` is returned as it is.

    Args:
        plan: A `Plan` (its `backend`, `strategy`, `devices` and `replicas`).
        instance: The user's own strategy or distribution, or None.
    """
    return backend_module(plan).build(plan, instance)


def activated(plan: Any, built: Any) -> Any:
    """A context manager under which Keras's `fit` trains with `built` (what
    `build` returned for `plan`): on JAX the distribution set for the run; on
    TensorFlow nothing (the model's variables carry their strategy)."""
    return backend_module(plan).activated(built)


def place(plan: Any, built: Any, model: Any) -> Any:
    """Puts `model`'s variables where `built` trains them, where the backend
    needs it done (JAX: a model built before its distribution); returns the
    undo, or None."""
    return backend_module(plan).place(model, built)


def keep_state(plan: Any, model: Any) -> Any:
    """Where the backend's step consumes its state (JAX donates it: after a
    failed step the model's variables are deleted), a copy of the model's
    state on the host and the function that puts it back; else None."""
    return backend_module(plan).keep_state(model)
