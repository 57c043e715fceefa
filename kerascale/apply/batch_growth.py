"""The batch that trains best per second, grown inside the run: a `Lever`
of the run's controller (issue 78).

At each epoch's end it times the epoch's steady steps (the first call,
which compiles, left out), measures the gradient noise scale on the
training arrays (`gradient_noise.sample`: no trace in training), and asks
`goodput.grow` for the batch of the rest of the run. A new batch starts at
the next epoch, its learning rate scaled by the optimizer's rule
(`goodput.rule_of`); the batch at most doubles an epoch, so the rate rises
in steps no larger than the rule's at a doubling (a warmup by epochs).
When the run ends the optimizer's learning rate is put back, as a rate at
your batch (a `ReduceLROnPlateau`'s cuts kept).

`wanted` says whether a run can grow its batch, and why not where it
cannot; the batch is then the one the plan chose, as before.

Its design: docs/design/modules.md, `kerascale.apply.batch_growth`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import keras

from kerascale import _keras_compat as keras_compat
from kerascale.apply import gradient_noise
from kerascale.apply.controller import Lever
from kerascale.apply.model import core_optimizer
from kerascale.plan import goodput
from kerascale.sense import callback_hooks
from kerascale.sense.model_facts import borrow_problem

# Micro-batches of each noise measurement (of the base batch each).
PARTS = 8
# Steady steps an epoch needs for its time to count.
TIMED_STEPS = 4
# The noise measurements may take at most this share of the run's training
# time so far (the first is always taken): an epoch's end skips one beyond
# it. A CNN's (the quickstart's, JAX) took 0.06 s of a 0.45 s epoch.
MEASURE_SHARE = 0.05
# Keras's callbacks that set the learning rate by the epoch, in absolute
# terms: a scaled rate would be overwritten (ReduceLROnPlateau's cuts are
# relative, and kept).
_SETS_THE_RATE = (keras.callbacks.LearningRateScheduler,)


def wanted(
    model: Any,
    *,
    batch: int,
    samples: int | None,
    fit_kwargs: Mapping[str, Any],
    callbacks: list[Any],
) -> str:
    """ "" where a run of `model` at `batch` on `samples` training arrays can
    grow its batch, else why not (in words that follow "the batch stays:").
    """
    optimizer = getattr(model, "optimizer", None)
    rule = goodput.rule_of(optimizer) if optimizer is not None else None
    if rule is None:
        name = type(optimizer).__name__ if optimizer is not None else "none"
        return f"no learning-rate rule is known for your optimizer ({name})"
    rate = keras_compat.learning_rate_object(core_optimizer(optimizer))
    if not isinstance(rate, keras.Variable):
        return (
            "your learning rate is a schedule or a function, which counts steps "
            "at your batch"
        )
    problem = borrow_problem(model)
    if problem:
        return f"the noise scale cannot be measured: {problem}"
    for name in ("steps_per_epoch", "class_weight"):
        if fit_kwargs.get(name) is not None:
            return f"{name} is given, which counts at your batch"
    epochs = fit_kwargs.get("epochs", 1) - fit_kwargs.get("initial_epoch", 0)
    if not isinstance(epochs, int) or epochs < 3:
        return "the run has fewer than 3 epochs: too short to measure and change"
    if samples is None or samples < 2 * batch * goodput.MIN_UPDATES:
        return (
            f"an epoch of {samples} samples has room for no larger batch with "
            f"{goodput.MIN_UPDATES} updates"
        )
    hook = callback_hooks.overridden_hook(callbacks)
    if hook is not None:
        return f"{hook[0]} acts per batch ({hook[1]}), counting batches of yours"
    for callback in callbacks:
        if isinstance(callback, _SETS_THE_RATE):
            return f"{type(callback).__name__} sets the learning rate by the epoch"
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            return "BackupAndRestore resumes at your batch"
    return ""


class BatchGrowth(Lever):
    """Grows the batch of a run on arrays where goodput rises.

    Args:
        x, y, sample_weight: The training arrays (`fit`'s, before any
            `validation_split`).
        samples: Training samples an epoch (after `validation_split`).
        batch: The batch the run starts at (the base of goodput).
        ceiling: The largest batch it may grow to.
        say: Where a change is told (`print`, or nothing).
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        *,
        samples: int,
        batch: int,
        ceiling: int,
        say: Any = None,
    ):
        super().__init__()
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.samples, self.base, self.batch = samples, batch, batch
        self.ceiling = min(ceiling, samples // goodput.MIN_UPDATES)
        self.say = say
        self.scale = goodput.NoiseScale()
        self.timings = EpochTimes()
        self.growths: list[tuple[int, goodput.Growth]] = []
        self.factor = 1.0
        self.stopped = False
        self.measure_seconds = 0.0
        self._before = batch
        self.taken = 0
        self._rule = None
        self._epoch_start = self._first_end = self._train_end = None
        self._first_steps = 0

    def on_train_begin(self, logs=None):
        self._rule = goodput.rule_of(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start, self._first_end, self._train_end = (
            time.perf_counter(),
            None,
            None,
        )

    def on_train_batch_end(self, batch, logs=None):
        if self._first_end is None:
            self._first_end = time.perf_counter()
            self._first_steps = batch + 1

    def on_test_begin(self, logs=None):
        if self._train_end is None:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self._first_end is not None:
            end = self._train_end or time.perf_counter()
            self.timings.add(
                self.batch,
                end - self._epoch_start,
                self.params.get("steps") or 0,
                self._first_end - self._epoch_start,
                self._first_steps,
            )
        if self._measures(epoch):
            began = time.perf_counter()
            span = self.base * PARTS
            start = (self.taken * span) % (self.samples - span + 1)
            self.taken += 1
            self.scale.add(
                gradient_noise.sample(
                    self.model,
                    self.x,
                    self.y,
                    self.sample_weight,
                    small=self.base,
                    parts=PARTS,
                    start=start,
                )
            )
            self.measure_seconds += time.perf_counter() - began
        if logs is not None:
            logs["batch_size"] = self.batch
            noise = self.scale.value
            logs["noise_scale"] = math.nan if noise is None else noise

    def _measures(self, epoch: int) -> bool:
        """Whether to measure the noise scale at `epoch`'s end: not at the
        run's last, nor once the batch can grow no more, nor while the
        measurements are over `MEASURE_SHARE` of the training time."""
        if self.stopped or epoch + 1 >= self.params.get("epochs", 0):
            return False
        if 2 * self.batch > self.ceiling:
            return False
        trained = self.timings.seconds()
        return not self.taken or self.measure_seconds <= MEASURE_SHARE * trained

    def propose(self, epoch, logs):
        if self.stopped:
            return None
        steps = self.timings.steady()
        if self.base not in steps or not self.timings.settled(self.batch, self.base):
            return None
        remaining = (self.params["epochs"] - epoch - 1) * self.samples
        growth = goodput.grow(
            self.batch,
            self.base,
            self.scale.value,
            steps,
            ceiling=self.ceiling,
            remaining_samples=remaining,
            switch_seconds=self.timings.switch_seconds(),
        )
        self.growths.append((epoch, growth))
        if growth.batch == self.batch:
            return None
        return {"batch_size": growth.batch}

    def changed(self, arguments):
        new = arguments["batch_size"]
        factor = self._rule.factor(new, self.base)
        rate = keras_compat.learning_rate_object(core_optimizer(self.model.optimizer))
        rate.assign(rate.numpy() * factor / self.factor)
        if self.say is not None:
            growth = self.growths[-1][1]
            self.say(
                f"kerascale: batch {self.batch} -> {new} from the next epoch "
                f"(noise scale {growth.noise:.0f}, goodput x{growth.gain:.2f}); "
                f"learning rate x{factor:.3g} of yours ({self._rule.why})"
            )
        self._before = self.batch
        self.batch, self.factor = new, factor

    def undone(self, arguments, error):
        new, old = arguments["batch_size"], self._before
        rate = keras_compat.learning_rate_object(core_optimizer(self.model.optimizer))
        factor = self._rule.factor(old, self.base)
        rate.assign(rate.numpy() * factor / self.factor)
        self.batch, self.factor, self.stopped = old, factor, True
        return (
            f"Not applied: batch {new}, because its first step failed "
            f"({type(error).__name__}: {str(error)[:200]}): the run goes on at "
            f"batch {old}, which trained, and the batch stays. To choose the "
            "batch yourself, pass batch_size=."
        )

    def finish(self):
        if self.factor != 1.0:
            rate = keras_compat.learning_rate_object(
                core_optimizer(self.model.optimizer)
            )
            rate.assign(rate.numpy() / self.factor)
            self.factor = 1.0


class EpochTimes:
    """The training part of each epoch, per batch: a batch's first epoch
    compiles its step (the first call, and on JAX the epoch's last, shorter
    batch too), so its steady step is timed from its later epochs (the
    fastest: a busy machine only slows one), and what its first epoch cost
    beyond them is what moving to a new batch costs."""

    def __init__(self) -> None:
        # batch -> [(seconds, steps, first call's seconds, its steps)]
        self.epochs: dict[int, list[tuple[float, int, float, int]]] = {}

    def add(
        self, batch: int, seconds: float, steps: int, first: float, first_steps: int
    ) -> None:
        if steps - first_steps >= TIMED_STEPS:
            self.epochs.setdefault(batch, []).append(
                (seconds, steps, first, first_steps)
            )

    def seconds(self) -> float:
        """The training time of every epoch timed."""
        return sum(e[0] for epochs in self.epochs.values() for e in epochs)

    def settled(self, batch: int, base: int) -> bool:
        """Whether `batch` is timed past its first epoch (the base's first
        epoch is the run's own, compiled as `fit` would anyway: its steps
        after the first call count)."""
        return len(self.epochs.get(batch, ())) >= (1 if batch == base else 2)

    def steady(self) -> dict[int, float]:
        """The steady step's seconds, per batch timed."""
        out = {}
        for batch, epochs in self.epochs.items():
            if len(epochs) > 1:
                out[batch] = min(s / n for s, n, _, _ in epochs[1:])
            else:
                s, n, first, k = epochs[0]
                out[batch] = (s - first) / (n - k)
        return out

    def switch_seconds(self) -> float:
        """What a new batch cost the run beyond its steady steps: the most
        any batch's first epoch did (the base's first call, compiled with
        the run's other functions, until another is timed)."""
        steady, costs = self.steady(), [0.0]
        for batch, epochs in self.epochs.items():
            s, n, first, k = epochs[0]
            if len(epochs) > 1:
                costs.append(s - n * steady[batch])
            else:
                costs.append(first - k * steady[batch])
        return max(costs)
