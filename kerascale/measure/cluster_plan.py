"""One plan for every worker of a cluster (`decide`'s last step there)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kerascale.apply.tensorflow import cluster
from kerascale.errors import ConfigurationError
from kerascale.measure.decided import Found
from kerascale.measure.stages import At, Priceless
from kerascale.plan.measured import Measured
from kerascale.plan.reasons import Reason

if TYPE_CHECKING:
    from kerascale.measure.decided import Decided


def agree(decided: Decided) -> Found:
    """What makes the plan every worker of a cluster trains with.

    Each worker searched its own memory: all take the smallest batch any of
    them holds (so the global batch is the same everywhere and fits on every
    worker), and the chief's precision and recomputation (workers with
    different devices could choose differently, and the replicas must compute
    alike; a bound searched without recomputation holds with it). Needs
    `cluster.connect()`; every worker calls it once per `fit` or `plan`.
    """
    plan, result = decided.plan, decided.search
    peers = cluster.exchange(
        {
            "batch": result.per_replica_batch_size if result is not None else None,
            "precision": plan.precision,
            "recompute": plan.recompute,
            "global_batch_size": plan.global_batch_size,
        }
    )
    batches = [p["batch"] for p in peers if p["batch"] is not None]
    chief = peers[0]
    if all(p == chief for p in peers):
        return Found()
    if not batches and len({p["global_batch_size"] for p in peers}) > 1:
        sizes = ", ".join(str(p["global_batch_size"]) for p in peers)
        raise ConfigurationError(
            f"The workers planned different global batches ({sizes}): give every "
            "worker the same arguments and the same data."
        )
    changes: dict[str, Any] = {}
    if chief["precision"] != plan.precision:
        changes["precision"] = chief["precision"]
    if chief.get("recompute", "") != plan.recompute:
        changes["recompute"] = chief.get("recompute") or "off"
    settled = dataclasses.replace(decided.options, **changes)
    if result is not None:
        smallest = min(batches)
        why = Reason(
            "search.smallest_worker",
            why=result.reasons.get("batch_size", "searched"),
            workers=len(peers),
            batches=", ".join(str(b) for b in batches),
        )
        result = dataclasses.replace(
            result,
            per_replica_batch_size=smallest,
            batch_size=smallest * plan.replicas,
            reasons={**result.reasons, "batch_size": why},
        )
    found = Measured()
    if "precision" in changes:
        found = found.decided(
            precision=Reason("precision.chief", policy=chief["precision"])
        )
    if "recompute" in changes:
        found = found.decided(
            recompute=Reason("recompute.chief", mode=chief.get("recompute") or "none")
        )
    return Found(found, {"options": settled, "search": result})


class Agreed(Priceless):
    """On a cluster, the plan every worker trains with (`cluster_plan.agree`)."""

    name = "agree"

    def skip(self, at: At) -> Found | None:
        return None if at.call.clustered else Found()

    def measure(self, at: At) -> Found:
        return agree(at.decided)
