"""The cluster around this process: what TF_CONFIG, Vertex AI's CLUSTER_SPEC or
SLURM describe (`detect_cluster`), checked strictly.

TensorFlow's `TFConfigClusterResolver` accepts a missing task, an index past
the end of its list, an unknown task type, a port that is not a number and the
same address twice, and fails later (or hangs) once servers start. Here each
of those is a `ClusterConfigError` that names the field, raised before
anything starts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kerascale.errors import ClusterConfigError, UnsupportedError

TASK_TYPES = ("chief", "master", "worker", "ps", "evaluator")
# Vertex AI's worker pools, in order: the chief, workers, parameter servers,
# the evaluator.
VERTEX_POOLS = {
    "workerpool0": "chief",
    "workerpool1": "worker",
    "workerpool2": "ps",
    "workerpool3": "evaluator",
}


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A multi-process cluster described by the environment.

    Attributes:
        source: "TF_CONFIG", "CLUSTER_SPEC" (Vertex AI) or "SLURM".
        num_workers: Processes that train (chief and workers).
        task_type: This process's role, e.g. "worker" or "chief".
        task_index: This process's index within its role.
        error: Why the description could not be parsed, or None.
    """

    source: str
    num_workers: int = 0
    task_type: str | None = None
    task_index: int | None = None
    error: str | None = None

    @property
    def is_multi_worker(self) -> bool:
        """True when more than one process would train together."""
        return self.error is None and self.num_workers > 1


def validate_tf_config(text: str, *, source: str = "TF_CONFIG") -> dict[str, Any]:
    """Parses and checks a TF_CONFIG; returns it, or raises ClusterConfigError.

    Checks: valid JSON object; "cluster" a non-empty object of known task
    types, each a non-empty list of "host:port" with a numeric port in
    1..65535 and no address twice; "task" present, with a "type" that the
    cluster lists and an int "index" inside that list.
    """
    config = _load_json(source, text)
    if not isinstance(config, dict):
        raise _error(source, "", config, "a JSON object with 'cluster' and 'task'")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise _error(source, '["cluster"]', cluster, "a non-empty object of task lists")
    seen: dict[str, str] = {}
    for task_type, addresses in cluster.items():
        field = f'["cluster"]["{task_type}"]'
        if task_type not in TASK_TYPES:
            raise _error(source, field, task_type, f"a task type among {TASK_TYPES}")
        if not isinstance(addresses, list) or not addresses:
            raise _error(source, field, addresses, 'a non-empty list of "host:port"')
        for i, address in enumerate(addresses):
            where = f"{field}[{i}]"
            _check_address(source, where, address)
            if address in seen:
                raise ClusterConfigError(
                    f"{source}{where} repeats the address {address!r} of "
                    f"{source}{seen[address]}: every task needs its own host:port."
                )
            seen[address] = where
    task = config.get("task")
    if not isinstance(task, dict):
        raise _error(
            source,
            '["task"]',
            task,
            'an object like {"type": "worker", "index": 0}: which task this process is',
        )
    task_type = task.get("type")
    if task_type not in cluster:
        raise _error(
            source,
            '["task"]["type"]',
            task_type,
            f"one of the cluster's {sorted(cluster)}",
        )
    index = task.get("index", 0)
    size = len(cluster[task_type])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
        raise _error(
            source,
            '["task"]["index"]',
            index,
            f"an int from 0 to {size - 1} ({task_type!r} has {size} address(es))",
        )
    return config


def cluster_spec_to_tf_config(text: str) -> dict[str, Any]:
    """Vertex AI's CLUSTER_SPEC as a TF_CONFIG (checked): worker pools 0-3
    become chief, worker, ps and evaluator."""
    spec = _load_json("CLUSTER_SPEC", text)
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        raise _error("CLUSTER_SPEC", '["cluster"]', spec, "an object of worker pools")
    cluster = {}
    for pool, addresses in spec["cluster"].items():
        if pool not in VERTEX_POOLS:
            raise _error(
                "CLUSTER_SPEC",
                f'["cluster"]["{pool}"]',
                pool,
                f"a worker pool among {sorted(VERTEX_POOLS)}",
            )
        cluster[VERTEX_POOLS[pool]] = addresses
    task = spec.get("task")
    if not isinstance(task, dict) or task.get("type") not in VERTEX_POOLS:
        raise _error(
            "CLUSTER_SPEC",
            '["task"]',
            task,
            'an object like {"type": "workerpool1", ...}',
        )
    config = {
        "cluster": cluster,
        "task": {"type": VERTEX_POOLS[task["type"]], "index": task.get("index", 0)},
    }
    return validate_tf_config(json.dumps(config), source="CLUSTER_SPEC (as TF_CONFIG)")


def _load_json(source: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ClusterConfigError(
            f"{source} is not valid JSON ({e}). Received: {source}={text!r}"
        ) from None


def _check_address(source: str, where: str, address: Any) -> None:
    accepted = 'a "host:port" string with a port from 1 to 65535'
    if not isinstance(address, str) or ":" not in address:
        raise _error(source, where, address, accepted)
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _error(source, where, address, accepted)


def _error(source: str, field: str, value: Any, accepted: str) -> ClusterConfigError:
    return ClusterConfigError(
        f"{source}{field} must be {accepted}. Received: {source}{field}={value!r}"
    )


# --- Cluster ----------------------------------------------------------------


def detect_cluster(env: Mapping[str, str]) -> ClusterInfo | None:
    """Reads the cluster description from `env`, or None when there is none.

    TF_CONFIG comes first (Vertex AI, Kubernetes TFJob and Ray set it), then
    Vertex AI's CLUSTER_SPEC, then SLURM. A malformed description is returned
    with `error` set rather than raised: detection never fails, planning does.
    """
    if env.get("TF_CONFIG", "").strip():
        return _parse_tf_config(env["TF_CONFIG"])
    if env.get("CLUSTER_SPEC", "").strip():
        return _parse_cluster_spec(env["CLUSTER_SPEC"])
    if env.get("SLURM_JOB_ID"):
        return _parse_slurm(env)
    return None


def _parse_tf_config(text: str) -> ClusterInfo:
    try:
        config = validate_tf_config(text)
    except ClusterConfigError as e:
        return ClusterInfo(source="TF_CONFIG", error=str(e))
    return _cluster_info("TF_CONFIG", config, task_type=config["task"]["type"])


def _parse_cluster_spec(text: str) -> ClusterInfo:
    # Vertex AI: {"cluster": {"workerpool0": [...], ...}, "task": {...}}.
    # workerpool0 is the chief, workerpool1 the workers; 2 and 3 are parameter
    # servers and the evaluator, which do not train synchronously.
    try:
        config = cluster_spec_to_tf_config(text)
    except ClusterConfigError as e:
        return ClusterInfo(source="CLUSTER_SPEC", error=str(e))
    return _cluster_info(
        "CLUSTER_SPEC", config, task_type=json.loads(text)["task"]["type"]
    )


def _cluster_info(
    source: str, config: dict[str, Any], *, task_type: str
) -> ClusterInfo:
    cluster = config["cluster"]
    workers = sum(len(cluster.get(k) or ()) for k in ("chief", "master", "worker"))
    return ClusterInfo(
        source=source,
        num_workers=workers,
        task_type=task_type,
        task_index=config["task"].get("index", 0),
    )


def _parse_slurm(env: Mapping[str, str]) -> ClusterInfo:
    raw = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    rank = env.get("SLURM_PROCID")
    try:
        tasks = int(raw)
    except ValueError:
        return ClusterInfo(
            source="SLURM", error=f"SLURM task count is not a number: {raw!r}."
        )
    return ClusterInfo(
        source="SLURM",
        num_workers=tasks,
        task_type="worker",
        task_index=int(rank) if rank and rank.isdigit() else None,
    )


def check_trainable(info: ClusterInfo) -> None:
    """Raises for a cluster this process cannot train in: malformed, or a
    task that does not train synchronously (parameter server, evaluator)."""
    if info.error:
        raise ClusterConfigError(
            f"The cluster described by {info.source} is malformed: {info.error} "
            f"Fix {info.source}, or unset it to train on this machine alone."
        )
    if info.task_type in ("ps", "evaluator"):
        raise UnsupportedError(
            f"This process is a {info.task_type!r} task of the {info.source} "
            "cluster. kerascale trains with MultiWorkerMirroredStrategy, whose "
            "tasks are 'chief' and 'worker'; a parameter server needs "
            "tf.distribute.ParameterServerStrategy, and an evaluator runs its "
            "own evaluation loop. Start only chief and worker tasks."
        )
