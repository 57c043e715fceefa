"""Which of the run's callbacks would see fewer calls at several training
steps per call: Keras calls the batch hooks once per call (its
`compile(steps_per_execution=...)` docs).

A hook counts as overridden where a callback's class defines its own, or
where it was set on the callback itself (`keras.callbacks.LambdaCallback`).
Keras's own callbacks that do nothing per batch as configured are told
apart by their settings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras

from kerascale import _keras_compat as keras_compat

# Train and test hooks: validation runs as many steps per call too.
BATCH_HOOKS = (
    "on_batch_begin",
    "on_batch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
)


def overridden_hook(callbacks: Iterable[Any] | None) -> tuple[str, str] | None:
    """(the first callback's name, its hook) of `callbacks` that acts per
    batch, or None where none does."""
    for callback in callbacks or ():
        hook = _per_batch(callback)
        if hook is not None:
            return _name(callback), hook
    return None


def _per_batch(callback: Any) -> str | None:
    if getattr(callback, "steps_per_execution_safe", False):
        return None  # kerascale's own: counts the steps a call ran
    if _batchless(callback):
        return None
    base = keras.callbacks.Callback
    for hook in BATCH_HOOKS:
        if hook in vars(callback) and vars(callback)[hook] is not None:
            return hook
        own = getattr(type(callback), hook, None)
        if own is not None and own is not getattr(base, hook):
            return hook
    return None


def _batchless(callback: Any) -> bool:
    """Keras's callbacks whose batch hooks do nothing per batch as set up:
    the progress bar (Keras documents it updating once per call), and a
    checkpoint or TensorBoard writing per epoch and profiling nothing."""
    if isinstance(callback, keras.callbacks.ProgbarLogger | keras.callbacks.History):
        return True
    if type(callback) is keras.callbacks.ModelCheckpoint:
        return getattr(callback, "save_freq", "epoch") == "epoch"
    if type(callback) is keras.callbacks.BackupAndRestore:
        return getattr(callback, "save_freq", "epoch") == "epoch"
    if type(callback) is keras.callbacks.TensorBoard:
        return (
            getattr(callback, "update_freq", "epoch") == "epoch"
            and not getattr(callback, "write_steps_per_second", False)
            and not keras_compat.tensorboard_profiles(callback)
        )
    return False


def _name(callback: Any) -> str:
    kind = type(callback)
    package = kind.__module__.split(".")[0]
    if package in ("keras", "kerascale"):
        return f"{'Keras' if package == 'keras' else 'kerascale'}'s {kind.__name__}"
    return f"your {kind.__name__}"
