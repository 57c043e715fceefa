"""Gradient accumulation, applied: reaching a batch larger than what fits.

Its design: docs/design/modules.md, `kerascale.apply.accumulation`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import keras

from kerascale import _keras_compat as keras_compat
from kerascale import _validation
from kerascale._state import value_of
from kerascale.apply.model import core_optimizer
from kerascale.errors import ConfigurationError, ModelError, warn

logger = logging.getLogger("kerascale")

# --- Learning rate -------------------------------------------------------------


@keras.saving.register_keras_serializable(package="kerascale")
class PerUpdate(keras.optimizers.schedules.LearningRateSchedule):
    """`factor * schedule(step // steps)`: the user's schedule, advanced once
    per optimizer update when Keras counts micro-steps, and scaled.

    Keras calls a schedule with the optimizer's raw iteration counter, which
    under gradient accumulation counts micro-steps; the update at micro-step
    i (0-based) happens when (i + 1) % steps == 0, so i // steps is the
    update's own index, as without accumulation.
    """

    def __init__(self, schedule: Any, steps: int = 1, factor: float = 1.0):
        self.schedule = schedule
        self.steps = int(steps)
        self.factor = float(factor)

    def __call__(self, step):
        s = keras.ops.floor_divide(step, self.steps) if self.steps > 1 else step
        lr = self.schedule(s)
        return lr * self.factor if self.factor != 1.0 else lr

    def get_config(self) -> dict[str, Any]:
        return {
            "schedule": keras.saving.serialize_keras_object(self.schedule),
            "steps": self.steps,
            "factor": self.factor,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PerUpdate:
        config = dict(config)
        config["schedule"] = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(**config)


# --- Switching it on and off -------------------------------------------------------


def _optimizer_of(model: Any) -> Any:
    opt = getattr(model, "optimizer", None)
    if opt is None or not getattr(model, "compiled", False):
        raise ModelError(
            "Gradient accumulation needs a compiled model with an optimizer. "
            "Call model.compile(optimizer=..., loss=...) first. Received: a model "
            "that is not compiled."
        )
    return core_optimizer(opt)


@dataclasses.dataclass
class _Saved:
    steps: Any
    learning_rate: Any  # schedule or callable, or a float value
    lr_is_value: bool


def apply(model: Any, steps: int, factor: float = 1.0) -> _Saved:
    """Sets `steps` micro-batches per update and scales the learning rate by
    `factor` on `model`'s optimizer (the inner one under loss scaling), in
    place; returns what `restore` needs to undo it.

    An optimizer that is already built gets its accumulators made now, in the
    variables' distribution scope, as Keras's `build` would have made them.
    """
    opt = _optimizer_of(model)
    saved = _Saved(opt.gradient_accumulation_steps, None, False)
    lr = keras_compat.learning_rate_object(opt)
    if isinstance(lr, PerUpdate):  # ours, from an earlier call: replace it
        lr = lr.schedule
    is_schedule = isinstance(lr, keras.optimizers.schedules.LearningRateSchedule)
    if steps > 1 and not opt.gradient_accumulation_steps:
        if opt.built:
            keras_compat.add_accumulators(opt)
        # The counter counts micro-steps under accumulation: u updates so far
        # are u * steps micro-steps, so that `iterations` (and Adam's bias
        # correction) read u, as before.
        steps_counter = keras_compat.iterations_variable(opt)
        steps_counter.assign(steps_counter * steps)
    opt.gradient_accumulation_steps = steps if steps > 1 else None
    if steps > 1:
        keras_compat.fix_distributed_accumulation(opt)
    if is_schedule and (steps > 1 or factor != 1.0):
        saved.learning_rate = lr
        opt.learning_rate = PerUpdate(lr, steps, factor)
    elif callable(lr) and not isinstance(lr, keras.Variable) and factor != 1.0:
        saved.learning_rate = lr
        opt.learning_rate = lambda: lr() * factor
    elif factor != 1.0:
        value = float(keras.ops.convert_to_numpy(lr))
        saved.learning_rate, saved.lr_is_value = value, True
        opt.learning_rate = value * factor
    model.train_function = None  # traced with the old settings
    return saved


def restore(model: Any, saved: _Saved) -> None:
    """Undoes `apply`: the user's schedule object or learning rate, and their
    accumulation setting (the accumulator variables stay, unused)."""
    opt = _optimizer_of(model)
    k = opt.gradient_accumulation_steps
    if k and not saved.steps:
        counter = keras_compat.iterations_variable(opt)
        counter.assign(counter // k)  # back to updates
    opt.gradient_accumulation_steps = saved.steps
    keras_compat.unfix_distributed_accumulation(opt)
    if saved.learning_rate is not None:
        opt.learning_rate = saved.learning_rate
    model.train_function = None


def pending_micro_steps(model: Any) -> int:
    """Micro-steps accumulated since the last update (0 without accumulation)."""
    opt = _optimizer_of(model)
    k = opt.gradient_accumulation_steps
    return int(value_of(keras_compat.iterations_variable(opt))) % k if k else 0


def discard_partial_window(model: Any) -> int:
    """Ends training on a whole window: gradients of micro-steps since the
    last update are dropped (accumulators zeroed) and the step counter goes
    back to that update, so a later `fit` starts a full window and schedules
    see the same update count. Returns the number of micro-steps dropped."""
    opt = _optimizer_of(model)
    pending = pending_micro_steps(model)
    if pending:
        keras_compat.reset_accumulators(opt)
        counter = keras_compat.iterations_variable(opt)
        counter.assign(counter - pending)
    return pending


def finish(model: Any, saved: _Saved, steps: int, batch: int) -> int:
    """Ends a run that `apply` set up: drops a partial last window (warning
    how much), then `restore`. Returns the micro-steps dropped."""
    dropped = discard_partial_window(model)
    restore(model, saved)
    if dropped:
        warn(
            f"Training ended {dropped} micro-batch(es) into a window of {steps}: "
            "their gradients were not applied (every update saw exactly "
            f"{batch} samples). Make the number of steps a multiple of {steps} "
            "to use them."
        )
    return dropped


def accumulate(model: Any, steps: int, *, lr_factor: float = 1.0) -> Any:
    """Turns on gradient accumulation for an already-compiled model, for use
    with plain `model.fit`: each optimizer update then averages the gradients
    of `steps` batches, so `model.fit(ds.batch(b))` trains with an effective
    batch of `steps * b` in the memory of `b`.

    A learning-rate schedule is wrapped (the object you passed is not changed)
    so that it advances once per update, not once per batch; `lr_factor`
    scales the learning rate (a float or a schedule).

    Under plain `model.fit`, a window left partial at the end of an epoch
    carries over into the next epoch (no gradient is lost between epochs);
    at the end of training its gradients are not applied. Call
    `kerascale.accumulation.discard_partial_window(model)` to drop them
    explicitly before fitting again. BatchNormalization sees each batch on its
    own (see the module docs).

    Args:
        model: A compiled Keras model.
        steps: Batches per optimizer update; an int >= 1 (1 turns it off).
        lr_factor: Multiplies the learning rate; a positive number.

    Returns:
        `model`, changed in place.
    """
    steps = _validation.positive_int("steps", steps)
    if (
        isinstance(lr_factor, bool)
        or not isinstance(lr_factor, (int, float))
        or not lr_factor > 0
        or not math.isfinite(lr_factor)
    ):
        raise ConfigurationError(
            f"lr_factor must be a positive number (1.0 leaves the learning rate "
            f"as it is). Received: lr_factor={lr_factor!r}"
        )
    apply(model, steps, float(lr_factor))
    return model
