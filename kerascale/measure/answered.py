"""The answers `find_batch_size` gave in this process, for the check of a
batch `fit` is then passed.

The guide's sample searches, then trains at the answer under the same
`memory_limit` (issue 55). `fit` checks a batch it is passed against that
limit, with real steps whose figures vary by a few percent between runs
(two steps of one CNN at one batch took 658 and 691 MiB), against the
search's own margin: on JAX the check of an answer split it into 2
micro-batches in about half the runs. A check measures nothing new there:
the search that answered measured this model on this data under this limit,
in this process. So the check of a batch at or below an answer, for the
same model (its fingerprint unchanged), the same data objects, precision,
replicas, recomputation and limits, reads the answer, where this process
has not grown since by more than the limit's slack, and the batches `fit`
reads ahead (which the search's plan did not hold) fit in that slack too.
Anything else is measured again.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from kerascale.apply.jax.reader import HELD
from kerascale.measure import cache, host_share
from kerascale.plan.reasons import Reason
from kerascale.sense import memory

if TYPE_CHECKING:
    from kerascale.measure.request import SearchOptions
    from kerascale.measure.result import BatchSearchResult
    from kerascale.plan.plan import Plan

# Answers kept (the latest first); a notebook may search several models.
KEPT = 8


@dataclasses.dataclass(frozen=True)
class _Answer:
    model: weakref.ref
    fingerprint: str
    data: tuple[int, int]  # id(x), id(y): the same objects
    setting: tuple[Any, ...]  # precision, replicas, recompute, limits
    read_ahead: bool
    resident: int | None  # this process's resident bytes once answered
    result: BatchSearchResult


_ANSWERS: list[_Answer] = []


def _setting(plan: Plan, precision: str, search: SearchOptions) -> tuple[Any, ...]:
    return (
        precision,
        plan.replicas,
        plan.recompute,
        search.memory_limit,
        search.device_memory,
    )


def remember(
    model: Any,
    x: Any,
    y: Any,
    plan: Plan,
    search: SearchOptions,
    result: BatchSearchResult,
) -> None:
    """Keeps `find_batch_size`'s `result` (searched under `plan`, with the
    memory bounds of `search`) for a later check in this process. Only an
    answer under a memory bound is kept: without one there is nothing a
    check would compare."""
    if not (search.memory_limit or search.device_memory):
        return
    try:
        model_ref = weakref.ref(model)
        fingerprint = cache.model_fingerprint(model)
    except Exception:  # a model kerascale cannot name is measured again
        return
    answer = _Answer(
        model_ref,
        fingerprint,
        (id(x), id(y)),
        _setting(plan, result.precision, search),
        plan.data_changes.read_ahead,
        memory.resident_bytes(),
        result,
    )
    _ANSWERS[:] = [answer, *_ANSWERS[: KEPT - 1]]


def recall(
    model: Any,
    x: Any,
    y: Any,
    plan: Plan,
    search: SearchOptions | None,
) -> BatchSearchResult | None:
    """The answer that settles the check of `plan`'s batch, with why, or
    None where the check must measure (see the module's docstring)."""
    if search is None or not _ANSWERS:
        return None
    setting = _setting(plan, plan.precision, search)
    per_replica = plan.micro_batch_size
    for answer in _ANSWERS:
        if answer.model() is not model or answer.data != (id(x), id(y)):
            continue
        if answer.setting != setting:
            continue
        found = answer.result
        if per_replica > found.per_replica_batch_size:
            continue
        if cache.model_fingerprint(model) != answer.fingerprint:
            continue
        slack = host_share.slack(search.memory_limit or search.device_memory)
        grown = _grown_since(answer.resident)
        held = 0
        if plan.data_changes.read_ahead and not answer.read_ahead:
            held = _held_bytes(x, y, plan.micro_batch_size * plan.replicas)
            if held is None:
                continue
        if grown is None or grown + held > slack:
            continue
        why = Reason(
            "search.answered_here",
            batch=per_replica,
            answer=found.per_replica_batch_size,
            searched=str(found.reasons.get("batch_size", "")),
        )
        return dataclasses.replace(
            found, reasons={**found.reasons, "batch_size": why}, cached=True
        )
    return None


def forget() -> None:
    """Drops every answer (tests)."""
    _ANSWERS.clear()


def _grown_since(resident: int | None) -> int | None:
    now = memory.resident_bytes()
    if resident is None or now is None:
        return None
    return max(0, now - resident)


def _held_bytes(x: Any, y: Any, global_batch: int) -> int | None:
    """What the batches `fit` reads ahead (`apply.jax.reader.HELD`) hold at
    `global_batch`, for arrays; None for other inputs (measured again)."""
    leaves = [leaf for leaf in keras.tree.flatten((x, y)) if leaf is not None]
    if not leaves or not all(isinstance(a, np.ndarray) and a.ndim for a in leaves):
        return None
    per_sample = sum(a.nbytes // max(1, len(a)) for a in leaves)
    return HELD * per_sample * global_batch
