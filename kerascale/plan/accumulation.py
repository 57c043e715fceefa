"""Gradient accumulation, the rules: how a batch larger than what fits is
split into micro-batches, the learning-rate scaling factor, and what a
batch does to an epoch's updates. Pure.

Applying it (Keras's optimizer does the accumulating) is
`kerascale.apply.accumulation`'s job.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from kerascale.errors import ConfigurationError
from kerascale.plan.reasons import Reason

if TYPE_CHECKING:
    from kerascale.plan.measured import SearchAnswer
    from kerascale.plan.options import Options
    from kerascale.sense.data_facts import DataFacts

# model.fit's batch_size for arrays when none is given (all replicas).
KERAS_FIT_BATCH = 32

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
    why: Reason


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
        why = Reason("accumulation.fits" if max_micro else "accumulation.no_bound")
        return Split(per_replica, 1, True, why)
    k_min = math.ceil(per_replica / max_micro)
    k = k_min
    while per_replica / k >= MIN_FILL * max_micro:
        if per_replica % k == 0:
            micro = per_replica // k
            why = Reason(
                "accumulation.split",
                per_replica=per_replica,
                bound=max_micro,
                k=k,
                micro=micro,
            )
            return Split(micro, k, True, why)
        k += 1
    micro = per_replica // k_min
    least = math.ceil(MIN_FILL * max_micro)
    why = Reason(
        "accumulation.inexact",
        per_replica=per_replica,
        bound=max_micro,
        least=least,
        k=k_min,
        micro=micro,
    )
    return Split(micro, k_min, False, why)


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


def updates_changed(
    options: Options, data: DataFacts, global_batch: int
) -> Reason | None:
    """What a batch kerascale chose for arrays does to the optimisation,
    where it is not `model.fit`'s 32: the updates an epoch, before and
    after, and how to choose otherwise; None where they are the same (or
    `steps_per_epoch` fixes them). A batch of 337 for 2,720 samples trains
    9 updates an epoch where Keras's trains 85, with the learning rate
    unchanged: a user read the loss of 0.144 against 0.048 as kerascale's."""
    n = data.num_samples
    if (
        data.kind != "arrays"
        or options.batch_size != "auto"
        or data.steps_given
        or not n
        or not global_batch
    ):
        return None
    before, after = -(-n // KERAS_FIT_BATCH), -(-n // global_batch)
    if before == after:
        return None
    return Reason(
        "batch.updates",
        before=before,
        after=after,
        keras=KERAS_FIT_BATCH,
        scaled=options.lr_scaling is not None,
    )


def for_request(
    options: Options,
    data: DataFacts,
    requested: int,
    replicas: int,
    search: SearchAnswer | None,
) -> tuple[Split, list[str]]:
    """How each replica reaches its share of `requested`: micro x k, and
    the warnings to give. `search`: the batch search's result, or None."""
    per_replica = requested // replicas
    k = options.accumulation_steps
    if data.kind in ("pydataset", "other") and (not k or k == 1):
        return _unsplit(options, data, per_replica, replicas, search)
    if k and k > 1 and data.kind in ("pydataset", "other"):
        raise ConfigurationError(
            "accumulation_steps cannot split the batches of a keras.utils.PyDataset "
            "(it makes its own): make its batches the micro-batch and pass "
            "kerascale.accumulate(model, steps) with plain model.fit, or use a "
            f"tf.data.Dataset. Received: accumulation_steps={k}"
        )
    if k:
        if per_replica % k:
            raise ConfigurationError(
                f"accumulation_steps must divide the batch per replica "
                f"({requested} / {replicas} replicas = {per_replica}) into equal "
                f"micro-batches. Received: accumulation_steps={k}. Use a divisor of "
                f"{per_replica}, or a batch_size divisible by {k * replicas}."
            )
        return Split(per_replica // k, k, True, Reason("accumulation.passed", k=k)), []
    bound, source = _micro_bound(options, data, replicas, search)
    sp = split(per_replica, bound)
    if sp.steps > 1:
        sp = dataclasses.replace(sp, why=sp.why.noted(f"{source} bound"))
    warnings = []
    if not sp.exact:
        below, above = nearest_exact(per_replica, bound, replicas)
        effective = sp.micro * replicas * sp.steps
        warnings.append(
            f"batch_size={requested} cannot be reached exactly: at most {bound} "
            f"samples per replica fit in one forward pass and {per_replica} has no "
            f"split into equal micro-batches that uses them well. Training with "
            f"{sp.micro} x {replicas} x {sp.steps} = {effective} samples per update "
            f"instead ({requested - effective} fewer). For exactly what you ask, "
            f"pass batch_size={below}"
            + (f" or {above}" if above != below else "")
            + f", or accumulation_steps= a divisor of {per_replica}."
        )
    return sp, warnings


def _micro_bound(
    options: Options, data: DataFacts, replicas: int, search: SearchAnswer | None
) -> tuple[int | None, str]:
    """The most samples per replica one forward pass may take, and whence:
    `max_batch_size`, or the search's measure where it only bounds it."""
    bound, source = None, ""
    if options.max_batch_size:
        bound, source = max(1, options.max_batch_size // replicas), "max_batch_size"
    # Where the search answered the batch itself, it bounds nothing here.
    searched = options.batch_size == "auto" and not data.batched
    if search is not None and not searched:
        measured = search.per_replica_batch_size
        if bound is None or measured < bound:
            bound, source = measured, "measured"
    return bound, source


def _unsplit(
    options: Options,
    data: DataFacts,
    per_replica: int,
    replicas: int,
    search: SearchAnswer | None,
) -> tuple[Split, list[str]]:
    """Data that makes its own batches trains on them as they are: kerascale
    cannot cut them into micro-batches, and says so where a bound asks it."""
    sp = Split(per_replica, 1, True, Reason("accumulation.not_split"))
    bound, source = _micro_bound(options, data, replicas, search)
    if not bound or not per_replica or per_replica <= bound:
        return sp, []
    what = "keras.utils.PyDataset" if data.kind == "pydataset" else "input"
    return sp, [
        f"Gradient accumulation skipped: your {what} makes its own batches of "
        f"{per_replica} per replica, above the {bound} that fit in one forward "
        f"pass ({source}), and kerascale cannot cut them. They train as they "
        f"are. To accumulate, make its batches {bound * replicas} and pass "
        f"accumulation_steps= with a tf.data.Dataset or arrays, or "
        "kerascale.accumulate(model, steps) with plain model.fit."
    ]
