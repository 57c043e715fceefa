"""The JAX processes the environment describes: what `jax.distributed` needs
to join them (the coordinator's address, the process count, this process's
index), read from the same sources as the TensorFlow path.

Its design: docs/design/modules.md, `kerascale.sense.jax_processes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kerascale.errors import ClusterConfigError
from kerascale.sense import cluster as cluster_lib

TRAINING_TASKS = ("chief", "master", "worker")
# `Hardware.cluster.source` once this process has joined JAX's processes.
JOINED = "jax.distributed"


@dataclasses.dataclass(frozen=True)
class Processes:
    """How to join the JAX processes of a job.

    Attributes:
        source: Where it was read ("JAX_COORDINATOR_ADDRESS", "KERAS_DISTRIBUTION",
            "TF_CONFIG", "CLUSTER_SPEC", "SLURM").
        coordinator: "host:port" of process 0's coordinator; None where JAX
            finds it itself (SLURM).
        num_processes: How many processes train; None where JAX finds it.
        process_id: This process's index; None where JAX finds it.
        error: Why the description is unusable, or "" (fit reports it).
    """

    source: str
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    error: str = ""

    @property
    def several(self) -> bool:
        """Whether two or more processes would train (None: JAX counts)."""
        return not self.error and (self.num_processes is None or self.num_processes > 1)


def describe(env: Mapping[str, str]) -> Processes | None:
    """The processes `env` describes, or None where it describes none."""
    if env.get("JAX_COORDINATOR_ADDRESS", "").strip():
        return _numbered(
            "JAX_COORDINATOR_ADDRESS",
            env["JAX_COORDINATOR_ADDRESS"].strip(),
            env,
            "JAX_NUM_PROCESSES",
            "JAX_PROCESS_ID",
        )
    if env.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "").strip():
        first = env["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")[0].strip()
        return _numbered(
            "KERAS_DISTRIBUTION",
            first,
            env,
            "KERAS_DISTRIBUTION_NUM_PROCESSES",
            "KERAS_DISTRIBUTION_PROCESS_ID",
        )
    for source in ("TF_CONFIG", "CLUSTER_SPEC"):
        if env.get(source, "").strip():
            return _from_tf_config(source, env[source])
    if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_NODELIST"):
        info = cluster_lib.detect_cluster(env)
        if info is not None and info.error:
            return Processes("SLURM", error=info.error)
        if info is not None and info.num_workers > 1:
            return Processes("SLURM", None, info.num_workers, info.task_index)
    return None


def _numbered(
    source: str, coordinator: str, env: Mapping[str, str], count: str, index: str
) -> Processes:
    try:
        num = _int_or_none(env, count)
        pid = _int_or_none(env, index)
    except ValueError as e:
        return Processes(source, error=str(e))
    if num is not None and num < 1:
        return Processes(source, error=f"{count} must be >= 1. Received: {num}")
    if num is not None and pid is not None and not 0 <= pid < num:
        return Processes(
            source,
            error=f"{index} must be from 0 to {num - 1}. Received: {index}={pid}",
        )
    return Processes(source, coordinator, num, pid)


def _int_or_none(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"{name} must be a whole number. Received: {name}={raw!r}")
    return int(raw)


def _from_tf_config(source: str, text: str) -> Processes:
    try:
        if source == "TF_CONFIG":
            config = cluster_lib.validate_tf_config(text)
        else:
            config = cluster_lib.cluster_spec_to_tf_config(text)
    except ClusterConfigError as e:
        return Processes(source, error=str(e))
    cluster, task = config["cluster"], config["task"]
    order = [(t, i) for t in TRAINING_TASKS for i in range(len(cluster.get(t) or ()))]
    if not order:
        return Processes(source, error=f"{source} lists no chief or worker task.")
    where = (task["type"], task.get("index", 0))
    if where not in order:
        return Processes(
            source,
            error=(
                f"this process is a {task['type']!r} task, which does not train "
                "with JAX's processes (only chief and worker tasks do)."
            ),
        )
    first_type, first_index = order[0]
    return Processes(
        source,
        cluster[first_type][first_index],
        len(order),
        order.index(where),
    )
