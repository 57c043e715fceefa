"""Building the strategy a plan names: `tf.distribute`'s on the TensorFlow
backend (the only step of the strategy decision that touches TensorFlow),
`keras.distribution`'s on JAX (`kerascale.apply.jax.distribution`)."""

from __future__ import annotations

import contextlib
from typing import Any

from kerascale.apply.jax import distribution as jax_distribution
from kerascale.errors import ConfigurationError


def build(plan: Any, instance: Any = None):
    """Creates the `tf.distribute.Strategy` for `plan`.

    Args:
        plan: A `Plan` (its `strategy` and `devices` are read).
        instance: The user's own strategy, returned as is when given.

    Returns:
        A `tf.distribute.Strategy`; on JAX a `keras.distribution.Distribution`
        or None (Keras's default).
    """
    if plan.backend == "jax":
        return jax_distribution.build(plan, instance)
    import tensorflow as tf

    if instance is not None:
        if isinstance(instance, tf.distribute.MultiWorkerMirroredStrategy):
            from kerascale.apply import keras_compat

            keras_compat.apply()  # Keras 3's fit needs it under this strategy
        return instance
    if plan.strategy == "default":
        return tf.distribute.get_strategy()
    if plan.strategy == "one_device":
        return tf.distribute.OneDeviceStrategy(plan.devices[0])
    if plan.strategy == "mirrored":
        return tf.distribute.MirroredStrategy(list(plan.devices))
    if plan.strategy == "multi_worker":
        from kerascale.apply import cluster

        conn = cluster.connection()
        dist = conn.strategy if conn else cluster.connect()
        if dist is None:
            raise ConfigurationError(
                "The plan trains on a cluster, but the environment no longer "
                "describes one (TF_CONFIG, CLUSTER_SPEC or SLURM changed)."
            )
        return dist
    if plan.strategy == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=plan.devices[0]
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ConfigurationError(f"Cannot build strategy {plan.strategy!r}.")


def activated(plan: Any, built: Any) -> Any:
    """A context manager under which Keras's `fit` trains with `built` (what
    `build` returned for `plan`): on JAX the distribution set for the run; on
    TensorFlow nothing (the model's variables carry their strategy)."""
    if plan.backend == "jax":
        return jax_distribution.activated(built)
    return contextlib.nullcontext()


def place(plan: Any, built: Any, model: Any) -> Any:
    """Puts `model`'s variables where `built` trains them, where the backend
    needs it done (JAX: a model built before its distribution); returns the
    undo, or None."""
    if plan.backend == "jax":
        return jax_distribution.place(model, built)
    return None


def keep_state(plan: Any, model: Any) -> Any:
    """Where the backend's step consumes its state (JAX donates it: after a
    failed step the model's variables are deleted), a copy of the model's
    state on the host and the function that puts it back; else None."""
    if plan.backend == "jax":
        return jax_distribution.keep_state(model)
    return None
