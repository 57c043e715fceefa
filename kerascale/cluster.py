"""Cluster descriptions: strict checks of TF_CONFIG and Vertex AI's CLUSTER_SPEC.

TensorFlow's `TFConfigClusterResolver` accepts a missing task, an index past
the end of its list, an unknown task type, a port that is not a number and the
same address twice, and fails later (or hangs) once servers start. Here each
of those is a `ClusterConfigError` that names the field, raised before
anything starts.
"""

from __future__ import annotations

import json
from typing import Any

from kerascale.errors import ClusterConfigError

TASK_TYPES = ("chief", "master", "worker", "ps", "evaluator")
# Vertex AI's worker pools, in order: the chief, workers, parameter servers,
# the evaluator.
VERTEX_POOLS = {
    "workerpool0": "chief",
    "workerpool1": "worker",
    "workerpool2": "ps",
    "workerpool3": "evaluator",
}


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
