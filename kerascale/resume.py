"""Resuming through `kerascale.fit`: which `FaultTolerantBackup` a run uses,
and the "auto" choices pinned to the plan of the checkpoint it resumes from
(so a new search or trial cannot change them between runs)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from kerascale import data as data_lib
from kerascale.callbacks import FaultTolerantBackup
from kerascale.errors import ConfigurationError
from kerascale.planning import Options, Plan

logger = logging.getLogger("kerascale")


def backup_for(
    checkpoint_dir: Any, checkpoint_freq: Any, fit_kwargs: dict[str, Any], verbose: Any
) -> FaultTolerantBackup | None:
    """The run's FaultTolerantBackup: the user's own in `callbacks`, or one
    made from `checkpoint_dir` (added to `callbacks`), or None."""
    callbacks = list(fit_kwargs.get("callbacks") or [])
    given = [c for c in callbacks if isinstance(c, FaultTolerantBackup)]
    if checkpoint_dir is None:
        checkpoint_dir = os.environ.get("AIP_CHECKPOINT_DIR") or None
        if checkpoint_dir is not None and not given:
            logger.info(
                "checkpoint_dir: AIP_CHECKPOINT_DIR=%s (Vertex AI)", checkpoint_dir
            )
    elif given:
        raise ConfigurationError(
            "Pass either checkpoint_dir or a FaultTolerantBackup in callbacks, "
            f"not both. Received: checkpoint_dir={checkpoint_dir!r} and "
            f"{given[0]!r} in callbacks"
        )
    if given:
        if checkpoint_freq != "epoch":
            raise ConfigurationError(
                "checkpoint_freq applies to checkpoint_dir; set save_freq on the "
                "FaultTolerantBackup you passed. Received: "
                f"checkpoint_freq={checkpoint_freq!r}"
            )
        return given[0]
    if checkpoint_dir is None:
        if checkpoint_freq != "epoch":
            raise ConfigurationError(
                "checkpoint_freq needs checkpoint_dir. Received: "
                f"checkpoint_freq={checkpoint_freq!r}, checkpoint_dir=None"
            )
        return None
    backup = FaultTolerantBackup(
        checkpoint_dir, save_freq=checkpoint_freq, verbose=0 if verbose == 0 else 1
    )
    fit_kwargs["callbacks"] = [*callbacks, backup]
    return backup


# Option -> the Plan reason it decides.
_PINNED_REASON = {
    "precision": "precision",
    "optimize_data": "data_changes",
    "batch_size": "global_batch_size",
    "accumulation_steps": "accumulation_steps",
}


def pin(
    options: Options, saved: Plan | None, x: Any, y: Any
) -> tuple[Options, list[str]]:
    """Options with the "auto" choices a checkpoint was written under, so a
    rerun resumes with them even if a new search or trial would differ; and
    the names of the options so set."""
    if saved is None:
        return options, []
    changes: dict[str, Any] = {}
    if options.precision == "auto":
        changes["precision"] = saved.precision
    if options.optimize_data == "auto":
        changes["optimize_data"] = "prefetch(AUTOTUNE)" in saved.data_changes
    if options.batch_size == "auto" and not data_lib.inspect(x, y).batched:
        changes["batch_size"] = saved.global_batch_size
    batch = changes.get("batch_size", options.batch_size)
    if options.accumulation_steps is None and batch == saved.global_batch_size:
        changes["accumulation_steps"] = saved.accumulation_steps
    return dataclasses.replace(options, **changes), sorted(changes)


def say_pinned(decided: Any, pinned: list[str]) -> Any:
    """The decision with reasons that say which choices came from the
    checkpoint being resumed (not "you asked for it")."""
    if not pinned:
        return decided
    reasons = dict(decided.plan.reasons)
    for name in pinned:
        key = _PINNED_REASON[name]
        reasons[key] = "as in the checkpoint being resumed"
    return dataclasses.replace(
        decided, plan=dataclasses.replace(decided.plan, reasons=reasons)
    )
