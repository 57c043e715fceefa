"""The callbacks `kerascale.fit` installs for its arguments: the run's
`FaultTolerantBackup` (`checkpoint_dir`, or one passed in `callbacks`) and
the watchers (`log_dir`, `profile`, `time_budget`), checked at the door."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import TYPE_CHECKING, Any

import keras

from kerascale import _tf
from kerascale import _validation as v
from kerascale.callbacks._input_source import draws_seeds
from kerascale.callbacks._save_schedule import parse_save_freq
from kerascale.callbacks._scalars import optional_dir
from kerascale.callbacks.backup import FaultTolerantBackup
from kerascale.callbacks.gpu_monitor import GPUMonitor
from kerascale.callbacks.prefetch import Prefetch
from kerascale.callbacks.profile import ProfileWindow
from kerascale.callbacks.throughput import Throughput
from kerascale.callbacks.time_budget import TimeBudget
from kerascale.errors import ConfigurationError, warn
from kerascale.plan import steps as steps_rules
from kerascale.sense import backend as backend_lib
from kerascale.sense import callback_hooks

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan

logger = logging.getLogger("kerascale")


def validate_checkpointing(checkpoint_freq: Any, start_over: Any) -> None:
    """`fit`'s `checkpoint_freq` and `start_over`, checked at the door under
    their own names (they become the backup's `save_freq` and
    `start_over`)."""
    parse_save_freq(checkpoint_freq, name="checkpoint_freq")
    v.boolean("start_over", start_over)


def steps_limit(
    callbacks: Any, monitoring: Monitoring, x: Any = None
) -> steps_rules.StepsLimit:
    """The bounds the run's callbacks (`fit`'s `callbacks`, with the run's
    backup), its monitoring and its input `x` put on an "auto" steps per
    call."""
    callbacks = list(callbacks or [])
    saves = [
        c.save_every_updates
        for c in callbacks
        if isinstance(c, FaultTolerantBackup) and c.save_every_updates
    ]
    backups = any(isinstance(c, FaultTolerantBackup) for c in callbacks)
    return steps_rules.for_run(
        hook=callback_hooks.overridden_hook(callbacks),
        save_every=math.gcd(*saves) if saves else None,
        profile=monitoring.window,
        counts_steps="a FaultTolerantBackup" if backups else "",
        # A backup that checkpoints the tf.data iterator itself (TensorFlow's
        # state format; JAX's reads the batches again).
        reshuffled_backup=backups
        and backend_lib.traits().state_format == "tf"
        and draws_seeds(x),
    )


def backup_for(
    checkpoint_dir: str | os.PathLike | None,
    checkpoint_freq: str | int,
    fit_kwargs: dict[str, Any],
    verbose: int | str,
    *,
    start_over: bool = False,
) -> FaultTolerantBackup | None:
    """The run's FaultTolerantBackup: the user's own in `callbacks`, or one
    made from `checkpoint_dir` (added to `callbacks`, training from scratch
    where `start_over`), or None."""
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
        if start_over:
            raise ConfigurationError(
                "start_over applies to checkpoint_dir; set start_over=True on "
                "the FaultTolerantBackup you passed. Received: start_over=True"
            )
        given[0].steps_per_epoch_given = fit_kwargs.get("steps_per_epoch") is not None
        return given[0]
    if checkpoint_dir is None:
        for name, value, default in (
            ("checkpoint_freq", checkpoint_freq, "epoch"),
            ("start_over", start_over, False),
        ):
            if value != default:
                raise ConfigurationError(
                    f"{name} needs checkpoint_dir. Received: "
                    f"{name}={value!r}, checkpoint_dir=None"
                )
        return None
    backup = FaultTolerantBackup(
        checkpoint_dir,
        save_freq=checkpoint_freq,
        start_over=start_over,
        verbose=0 if verbose == 0 else 1,
    )
    backup.start_over_words = "kerascale.fit(..., start_over=True)"
    backup.steps_per_epoch_given = fit_kwargs.get("steps_per_epoch") is not None
    fit_kwargs["callbacks"] = [*callbacks, backup]
    return backup


def loader(plan: Plan, callbacks: list[Any]) -> list[keras.callbacks.Callback]:
    """`Prefetch`, where the plan reads ahead on a thread (JAX) and one of
    `callbacks` makes Keras wait for each step."""
    if plan.data_changes.read_ahead and waits_on_steps(callbacks):
        return [Prefetch()]
    return []


def waits_on_steps(callbacks: list[Any]) -> bool:
    """Whether Keras's loop waits for each training step's logs with these
    callbacks: it does for one that has `on_train_batch_end` (or
    `on_batch_end`) of its own and does not say `async_safe`, as Keras's
    `CallbackList` decides."""
    base = keras.callbacks.Callback
    for callback in callbacks:
        if getattr(callback, "async_safe", False):
            continue
        kind = type(callback)
        if (
            kind.on_train_batch_end is not base.on_train_batch_end
            or kind.on_batch_end is not base.on_batch_end
        ):
            return True
    return False


DEFAULT_LOG_DIR = "kerascale_logs"
DEFAULT_PROFILE_WINDOW = (10, 14)  # after tracing and tf.data's warm-up


@dataclasses.dataclass(frozen=True)
class Monitoring:
    """`kerascale.fit`'s monitoring arguments, checked.

    Attributes:
        log_dir: Where TensorBoard's event files go (None: none written).
        window: The profiled steps (start, stop), or None.
        budget: The run's time budget in seconds, or None.
    """

    log_dir: str | None = None
    window: tuple[int, int] | None = None
    budget: float | None = None


def validate_fit_options(log_dir: Any, profile: Any, time_budget: Any) -> Monitoring:
    """`kerascale.fit`'s monitoring arguments, checked at the door."""
    log_dir = optional_dir("log_dir", log_dir)
    window = None
    accepted = "True, False or (start_step, stop_step) with 1 <= start <= stop"
    if isinstance(profile, bool):
        window = DEFAULT_PROFILE_WINDOW if profile else None
    elif isinstance(profile, (tuple, list)) and len(profile) == 2:
        start, stop = profile
        for value in (start, stop):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise v.fail("profile", profile, accepted)
        if stop < start:
            raise v.fail("profile", profile, accepted)
        window = (start, stop)
    else:
        raise v.fail("profile", profile, accepted)
    budget = None if time_budget is None else v.duration("time_budget", time_budget)
    return Monitoring(log_dir, window, budget)


def monitors(
    monitoring: Monitoring,
    *,
    samples_per_step: int,
    gpus: int,
    backup: FaultTolerantBackup | None,
) -> list[keras.callbacks.Callback]:
    """The callbacks `kerascale.fit` installs for its monitoring arguments.
    Without TensorFlow, which writes TensorBoard's event files, the monitors'
    figures go to `History` only, with one warning. On JAX the profile window
    is traced by `jax.profiler`, which needs no TensorFlow."""
    log_dir, window, budget = monitoring.log_dir, monitoring.window, monitoring.budget
    out: list[keras.callbacks.Callback] = []
    writes = _tf.available()
    if log_dir is not None:
        if not writes:
            warn(
                f"log_dir={log_dir!r}: TensorBoard event files need TensorFlow, "
                "which is not installed: the throughput (and GPU) figures go to "
                f"History only. `{_tf.INSTALL_HINT}` writes them."
            )
        # Without TensorFlow, History is where the figures go (said above).
        out.append(
            Throughput(
                samples_per_step, log_dir if writes else None, in_logs=not writes
            )
        )
        if gpus:
            out.append(GPUMonitor(log_dir if writes else None))
    needs_tf = backend_lib.traits().profiler_needs_tensorflow
    if window is not None and not writes and needs_tf:
        warn(
            f"profile=True was not used: the profile window is written through "
            f"Keras's TensorBoard callback, which needs TensorFlow, and it is not "
            f"installed. `{_tf.INSTALL_HINT}` gets it."
        )
    elif window is not None:
        out.append(ProfileWindow(log_dir or DEFAULT_LOG_DIR, *window))
    if budget is not None:
        limit = TimeBudget(budget)
        limit.backup = backup
        out.append(limit)
    return out
