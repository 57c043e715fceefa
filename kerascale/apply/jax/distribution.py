"""Building and activating the `keras.distribution` a JAX plan names.

Keras's JAX trainer splits each batch across the mesh when `fit` runs under
a distribution, and lays out variables created under it (replicated for
`DataParallel`). A model the user built before has its variables on one
device, which Keras's step refuses; `place` lays them out as the
distribution would have (`keras_compat.lay_out`), so the user's model
trains as it is, with no copy. The distribution is set for the run only:
`activated` puts back whatever was set before, and `place`'s undo the
variables' devices, however the run ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import keras

from kerascale import _keras_compat as keras_compat
from kerascale.apply.jax import cluster, compile_cache
from kerascale.errors import ConfigurationError

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan


def build(plan: Plan, instance: Any = None) -> Any:
    """The `keras.distribution.Distribution` for `plan`, or None for Keras's
    default (one device, no distribution).

    Args:
        plan: A `Plan` (its `strategy` and `replicas` are read).
        instance: The user's own distribution, returned as is when given.
    """
    if instance is not None:
        return instance
    if plan.strategy == "default":
        return None
    if plan.strategy == "data_parallel":
        import jax

        # Several processes: every process's devices (Keras splits each
        # global batch over them all); alone, the local ones.
        several = jax.process_count() > 1
        devices = jax.devices() if several else jax.local_devices()
        if len(devices) < plan.replicas:
            raise ConfigurationError(
                f"The plan trains {plan.replicas} replicas, and JAX sees "
                f"{len(devices)} device(s) now: plan again on this machine."
            )
        return keras.distribution.DataParallel(
            devices=devices[: plan.replicas],
            # kerascale gives each process its share (apply.jax.even_batches); Keras
            # shards a tf.data.Dataset itself (session sets it back for one).
            auto_shard_dataset=not several,
        )
    if plan.strategy == "model_parallel":
        return _model_parallel(plan)
    raise ConfigurationError(
        f"Cannot build {plan.strategy!r} on the JAX backend: one of 'default', "
        "'data_parallel', or a keras.distribution.Distribution."
    )


def _model_parallel(plan: Plan) -> Any:
    """`ModelParallel` over the plan's (batch, model) mesh of every
    process's devices, each variable the plan splits laid out as it says
    (matched by its whole path); the rest replicated."""
    import re

    import jax

    from kerascale.plan import model_sharding as sharding

    batch, model = plan.sharding["mesh"]
    devices = jax.devices()
    if len(devices) < batch * model:
        raise ConfigurationError(
            f"The plan shards over {batch * model} devices, and JAX sees "
            f"{len(devices)} now: plan again on this machine."
        )
    mesh = keras.distribution.DeviceMesh(
        shape=(batch, model),
        axis_names=(sharding.BATCH_AXIS, sharding.MODEL_AXIS),
        devices=devices[: batch * model],
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    for path, axes in plan.sharding["layouts"].items():
        layout_map[re.escape(path)] = tuple(axes)
    return keras.distribution.ModelParallel(
        layout_map=layout_map,
        batch_dim_name=sharding.BATCH_AXIS,
        auto_shard_dataset=jax.process_count() == 1,
    )


@contextlib.contextmanager
def activated(distribution: Any) -> Iterator[None]:
    """Sets `distribution` (None: none) as Keras's for the block, and puts
    back the one set before; JAX's compilation cache is on meanwhile
    (`compile_cache`: a step the batch search compiled is not compiled
    again)."""
    before = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        with compile_cache.on():
            yield
    finally:
        keras.distribution.set_distribution(before)


def place(model: Any, distribution: Any) -> Any:
    """Lays out `model`'s variables for `distribution` (None: nothing to
    do); returns the undo, or None."""
    if distribution is None:
        return None
    cluster.start_alike(model)
    return keras_compat.lay_out(model, distribution)


def keep_state(model: Any) -> Any:
    """A host copy of every variable Keras's JAX step carries (the step
    donates them), and the function that assigns it back."""
    import numpy as np

    variables = keras_compat.model_variables(model)
    kept = [np.asarray(v.value) for v in variables]

    def restore() -> None:
        for v, value in zip(variables, kept, strict=True):
            v.assign(value)

    return restore
