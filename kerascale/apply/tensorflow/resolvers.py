"""TensorFlow's cluster resolvers for the cluster the environment describes
(TF_CONFIG, Vertex AI's CLUSTER_SPEC, SLURM under `srun`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kerascale import _tf_compat as tfc
from kerascale.errors import ClusterConfigError
from kerascale.sense.cluster import (
    ClusterInfo,
    cluster_spec_to_tf_config,
    validate_tf_config,
)

# A SLURM job step's first port on each node (TensorFlow's own default).
SLURM_PORT_BASE = 8888


def cluster_resolver(info: ClusterInfo, environ: Mapping[str, str]) -> Any:
    """TensorFlow's cluster resolver for the described cluster."""
    import tensorflow as tf

    resolvers = tf.distribute.cluster_resolver
    if info.source == "TF_CONFIG":
        config = validate_tf_config(environ["TF_CONFIG"])
        return resolvers.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]),
            task_type=config["task"]["type"],
            task_id=config["task"].get("index", 0),
            rpc_layer=config.get("rpc_layer", "grpc"),
        )
    if info.source == "CLUSTER_SPEC":
        config = cluster_spec_to_tf_config(environ["CLUSTER_SPEC"])
        return resolvers.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]),
            task_type=config["task"]["type"],
            task_id=config["task"]["index"],
            rpc_layer="grpc",
        )
    if info.source == "SLURM":
        return slurm_resolver(environ)
    raise ClusterConfigError(f"Unknown cluster source {info.source!r}.")


def slurm_resolver(environ: Mapping[str, str]) -> Any:
    """TensorFlow's `SlurmClusterResolver` for this job step, resolved.

    GPUs are given to tasks by TensorFlow's rule (CUDA_VISIBLE_DEVICES is
    set) unless SLURM already set CUDA_VISIBLE_DEVICES. On CPU nodes the
    resolver's GPU arithmetic is given one pretend GPU per task, which it
    needs to lay tasks out and which assigns nothing.
    """
    import tensorflow as tf

    missing = [
        name
        for name in ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
        if not environ.get(name)
    ]
    if missing:
        raise ClusterConfigError(
            f"SLURM describes a job of several tasks but {', '.join(missing)} "
            "is not set: start the workers with `srun`, which sets it, or pass "
            "strategy='mirrored' to train in this one process."
        )
    tasks_per_node = tfc.slurm_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    per_node = max(tasks_per_node)
    gpus = environ.get("KERASCALE_SLURM_GPUS_PER_NODE")
    kwargs: dict[str, Any] = {"port_base": SLURM_PORT_BASE}
    if gpus and int(gpus) > 0 and "CUDA_VISIBLE_DEVICES" not in environ:
        kwargs.update(gpus_per_node=int(gpus), auto_set_gpu=True)
    else:
        kwargs.update(gpus_per_node=per_node, gpus_per_task=1, auto_set_gpu=False)
    saved = dict(os.environ)
    try:
        # The resolver reads os.environ; `environ` may be a test's dict.
        os.environ.update({k: v for k, v in environ.items() if k.startswith("SLURM_")})
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(**kwargs)
        spec = resolver.cluster_spec()
    except (RuntimeError, ValueError, KeyError) as e:
        raise ClusterConfigError(
            f"SLURM's environment could not be resolved to a cluster: {e}"
        ) from None
    finally:
        if environ is not os.environ:
            for key in set(os.environ) - set(saved):
                del os.environ[key]
            os.environ.update(saved)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=resolver.task_type, task_id=resolver.task_id, rpc_layer="grpc"
    )
