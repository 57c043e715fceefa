"""Joining JAX's processes (`jax.distributed`) with no extra line, and
starting them alike.

Its design: docs/design/modules.md, `kerascale.apply.jax.cluster`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from kerascale import _jax_compat
from kerascale import _keras_compat as keras_compat
from kerascale.apply.tensorflow import cluster as tf_cluster
from kerascale.errors import ClusterConfigError, warn
from kerascale.sense import jax_processes

logger = logging.getLogger("kerascale")

AUTO_CONNECT_ENV = "KERASCALE_AUTO_CONNECT"


def join_at_import(environ: Mapping[str, str] | None = None) -> bool:
    """What `import kerascale` does on JAX: joins the processes the
    environment describes (two or more), unless `KERASCALE_AUTO_CONNECT` is
    "0", JAX's processes are already joined, or JAX has started computing
    (then one warning says how to join). Waits until every process has
    joined (max(15 min, 15 x `KERASCALE_WORKER_TIMEOUT`)).

    Returns:
        Whether this call joined them.
    """
    env = os.environ if environ is None else environ
    if env.get(AUTO_CONNECT_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    described = jax_processes.describe(env)
    if described is None or not described.several:
        return False  # a malformed description: fit reports it
    import jax

    if jax.distributed.is_initialized():
        return False
    timeouts = tf_cluster.timeouts_from_env(env)  # the same worker_timeout
    if not _joined(described, timeouts):
        warn(
            f"{described.source} describes {described.num_processes or 'several'} "
            "JAX processes, and kerascale could not join them: JAX had already "
            "computed in this process. Import kerascale before anything runs "
            "JAX (or call jax.distributed.initialize() first); until then each "
            "process trains alone, as model.fit would."
        )
        return False
    logger.info(
        "joined %d JAX processes (%s), this is process %d",
        jax.process_count(),
        described.source,
        jax.process_index(),
    )
    return True


def _joined(described: jax_processes.Processes, timeouts: tf_cluster.Timeouts) -> bool:
    """Joins the processes `described` through `jax.distributed`; False
    where JAX has computed in this process already (it can join only before)."""
    import jax

    if _jax_compat.backends_started():
        return False
    jax.distributed.initialize(
        coordinator_address=described.coordinator,
        num_processes=described.num_processes,
        process_id=described.process_id,
        initialization_timeout=math.ceil(timeouts.start),
        heartbeat_timeout_seconds=math.ceil(timeouts.heartbeat),
    )
    return True


def connect(
    worker_timeout: float | str = tf_cluster.DEFAULT_WORKER_TIMEOUT,
    *,
    environ: Mapping[str, str] | None = None,
) -> Any:
    """`kerascale.connect_cluster()` on JAX: joins the JAX processes the
    environment describes through `jax.distributed` (or finds them joined
    already, by `import kerascale` or by you), and never starts TensorFlow.

    Returns:
        A `keras.distribution.DataParallel` over every process's devices,
        or None where the environment describes one process only.

    Raises:
        ClusterConfigError: For a malformed description, or when JAX has
            already computed in this process and cannot join any more.
    """
    timeouts = tf_cluster.validate_timeout(worker_timeout)
    env = os.environ if environ is None else environ
    import jax

    if not jax.distributed.is_initialized():
        described = jax_processes.describe(env)
        if described is None:
            return None
        if described.error:
            raise ClusterConfigError(f"{described.source}: {described.error}")
        if not described.several:
            return None
        if not _joined(described, timeouts):
            raise ClusterConfigError(
                f"{described.source} describes {described.num_processes or 'several'}"
                " JAX processes, but JAX has already computed in this process, and "
                "it can only join them before. Call kerascale.connect_cluster() "
                "(or import kerascale, which joins them) at the top of your "
                "script, before building the model or the data."
            ) from None
    elif worker_timeout != tf_cluster.DEFAULT_WORKER_TIMEOUT:
        warn(
            f"JAX's processes were joined already (at import, or by "
            f"jax.distributed.initialize); worker_timeout={worker_timeout!r} is "
            f"ignored. Set {tf_cluster.WORKER_TIMEOUT_ENV} in the environment "
            "for the join at import."
        )
    if jax.process_count() == 1:
        return None
    import keras

    return keras.distribution.DataParallel(devices=jax.devices())


def processes() -> tuple[int, int]:
    """(how many JAX processes train, this one's index): (1, 0) alone."""
    import jax

    return jax.process_count(), jax.process_index()


def start_alike(model: Any) -> None:
    """Gives every process process 0's values of the model's variables (its
    optimizer's too, where built), before Keras lays them out over every
    process's devices. Alone, nothing to do."""
    if processes()[0] == 1:
        return
    import numpy as np
    from jax.experimental import multihost_utils

    variables = keras_compat.model_variables(model)
    values = [np.asarray(v.value) for v in variables]
    shared = multihost_utils.broadcast_one_to_all(values)
    for v, value in zip(variables, shared, strict=True):
        v.assign(np.asarray(value))
