"""Gradient accumulation, the rules: how a batch larger than what fits is
split into micro-batches, and the learning-rate scaling factor. Pure.

Applying it (Keras's optimizer does the accumulating) is
`kerascale.apply.accumulation`'s job.
"""

from __future__ import annotations

import dataclasses
import math

# An exact split is taken if its micro-batch is at least this share of the
# largest that fits; below it, fewer, fuller micro-batches are worth a
# slightly different effective batch (said loudly).
MIN_FILL = 0.5


@dataclasses.dataclass(frozen=True)
class Split:
    """How one replica's share of the batch is reached.

    Attributes:
        micro: Samples per forward pass, per replica.
        steps: Micro-batches per optimizer update (k).
        exact: Whether micro x steps is the requested per-replica batch.
        why: One line for the plan.
    """

    micro: int
    steps: int
    exact: bool
    why: str


def split(per_replica: int, max_micro: int | None) -> Split:
    """The smallest k that splits `per_replica` into k equal micro-batches of
    at most `max_micro` samples. Pure.

    Candidates run from k = ceil(per_replica / max_micro) upwards while the
    micro-batch stays at least half of `max_micro` (a micro-batch far below
    what fits wastes the hardware). If none divides exactly, the smallest k
    is taken with micro = per_replica // k, and `exact` is False: the caller
    must tell the user that the effective batch is micro x k, not the request.
    """
    if not max_micro or per_replica <= max_micro:
        why = (
            "the batch fits in one forward pass"
            if max_micro
            else "no memory bound known: one forward pass per update"
        )
        return Split(per_replica, 1, True, why)
    k_min = math.ceil(per_replica / max_micro)
    k = k_min
    while per_replica / k >= MIN_FILL * max_micro:
        if per_replica % k == 0:
            micro = per_replica // k
            return Split(
                micro,
                k,
                True,
                f"{per_replica} per replica does not fit (at most {max_micro}): "
                f"{k} micro-batches of {micro}, gradients averaged",
            )
        k += 1
    micro = per_replica // k_min
    least = math.ceil(MIN_FILL * max_micro)
    return Split(
        micro,
        k_min,
        False,
        f"{per_replica} per replica does not fit (at most {max_micro}) and has "
        f"no split into equal micro-batches of at least {least}: "
        f"{k_min} x {micro} = {micro * k_min} per replica instead",
    )


def nearest_exact(per_replica: int, max_micro: int, replicas: int) -> tuple[int, int]:
    """Global batches just below and above the request that split exactly
    into `ceil(per_replica / max_micro)` micro-batches that fit."""
    k = math.ceil(per_replica / max_micro)
    below = per_replica // k * k
    above = below + k if (below + k) // k <= max_micro else below
    return below * replicas, above * replicas


def lr_factor(scaling: str | None, effective: int, base: int | None) -> float:
    """B/base ("linear") or sqrt(B/base) ("sqrt"); 1 without scaling or base."""
    if scaling is None or not base or effective == base:
        return 1.0
    ratio = effective / base
    return ratio if scaling == "linear" else math.sqrt(ratio)
