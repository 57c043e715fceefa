"""Building the `tf.distribute` strategy a TensorFlow plan names (the only
step of the strategy decision that touches TensorFlow), and the rest of
the backend's part in `kerascale.apply.strategy`: nothing to activate or
place, since the model's variables carry their strategy."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from kerascale.errors import ConfigurationError

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan


def build(plan: Plan, instance: Any = None) -> Any:
    """The `tf.distribute.Strategy` for `plan` (its `strategy` and
    `devices`), or the user's own `instance` as it is."""
    import tensorflow as tf

    if instance is not None:
        if isinstance(instance, tf.distribute.MultiWorkerMirroredStrategy):
            from kerascale import _keras_compat as keras_compat

            keras_compat.apply()  # Keras 3's fit needs it under this strategy
        return instance
    if plan.strategy == "default":
        return tf.distribute.get_strategy()
    if plan.strategy == "one_device":
        return tf.distribute.OneDeviceStrategy(plan.devices[0])
    if plan.strategy == "mirrored":
        return tf.distribute.MirroredStrategy(list(plan.devices))
    if plan.strategy == "multi_worker":
        from kerascale.apply.tensorflow import cluster

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


def activated(built: Any) -> Any:
    """Nothing to set for the run: the model's variables carry their
    strategy, and Keras's fit trains under it."""
    del built
    return contextlib.nullcontext()


def place(model: Any, built: Any) -> None:
    """Nothing to place: a model whose variables are not in the strategy's
    scope is re-created there (`kerascale.apply.model.recreate`)."""
    del model, built


def keep_state(model: Any) -> None:
    """TensorFlow's step does not consume its state: nothing to keep."""
    del model
