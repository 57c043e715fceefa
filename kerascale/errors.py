"""Errors raised by kerascale.

Each error also inherits the builtin it refines, so ``except ValueError`` keeps
working for users who do not know about kerascale (keras-tuner does the same).
"""

from __future__ import annotations

import sys
import warnings


class KerascaleError(Exception):
    """Base class of every error kerascale raises on purpose."""


class ConfigurationError(KerascaleError, ValueError):
    """A user argument is invalid: the message names it, the value and the fix."""


class DataError(KerascaleError, ValueError):
    """The training or validation data cannot be used as given."""


class ClusterConfigError(KerascaleError, ValueError):
    """A cluster description (TF_CONFIG, SLURM, CLUSTER_SPEC) is malformed."""


class UnsupportedError(KerascaleError, NotImplementedError):
    """The request is valid but kerascale cannot carry it out on this setup."""


class ModelError(KerascaleError, ValueError):
    """The model cannot be trained as given (not compiled, not buildable...)."""


class BatchSizeSearchError(KerascaleError, RuntimeError):
    """The batch-size search could not find a batch that fits, or a probe
    failed for a reason other than memory (the message carries it).

    Attributes:
        out_of_memory: True when even the smallest batch ran out of memory,
            False when a probe failed for another reason.
        probe_message: The failed probe's own message, where a probe failed
            for a reason other than memory; else "".
    """

    def __init__(
        self,
        message: str = "",
        *,
        out_of_memory: bool = False,
        probe_message: str = "",
    ):
        super().__init__(message)
        self.out_of_memory = out_of_memory
        self.probe_message = probe_message


class CheckpointError(KerascaleError, RuntimeError):
    """A checkpoint directory cannot be resumed from: nothing valid is left in
    it, or it was written by a different configuration (the message says
    what changed and how to start over)."""


class WorkerLostError(KerascaleError, RuntimeError):
    """Another worker of the cluster died or stopped responding, so training
    cannot go on: restart every worker (with checkpoints, it resumes)."""


class KerascaleWarning(UserWarning):
    """What the user should know about a run: a choice that was not applied,
    and why. Shown by default, like Keras's warnings; filter it with
    ``warnings.filterwarnings("ignore", category=kerascale.KerascaleWarning)``.
    """


def first_line(e: BaseException) -> str:
    """An error's message on one line for a sentence of ours: its first line
    (a traceback-sized message goes on), or its type's name where it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# Frames of these packages are never the line a warning is about.
_INTERNAL = ("kerascale", "keras", "tensorflow", "keras_tuner", "contextlib")


def warn(message: str) -> None:
    """Shows `message` as a `KerascaleWarning` from the user's own line: the
    first caller outside kerascale, Keras and TensorFlow (the `kerascale.fit`
    or `model.fit` call a callback runs in). Shown by default, like Keras's
    warnings, whatever `verbose` says, and filterable by category."""
    warnings.warn(message, KerascaleWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    # sys._getframe(k) here is the frame `warnings.warn(stacklevel=k)` in
    # `warn` names: 1 is `warn` itself, 2 its caller.
    level, frame = 2, sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in _INTERNAL:
            return level
        level, frame = level + 1, frame.f_back
    return 2  # a thread of kerascale's own: its caller is as good as any
