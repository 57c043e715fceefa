"""`ScaledLearningRate`: your learning rate, scaled for a larger batch by
the rule that fits your optimizer, and put back when `fit` ends."""

from __future__ import annotations

import keras

from kerascale import _keras_compat as keras_compat
from kerascale import _validation as v
from kerascale.apply.model import core_optimizer
from kerascale.callbacks._base import KerascaleCallback
from kerascale.errors import warn
from kerascale.plan import goodput

# The linear rule's warmup (Goyal et al. 2017: 5 of 90 epochs): a tenth of
# the run, at least 1 epoch and at most 5.
WARMUP_SHARE = 0.1
MAX_WARMUP_EPOCHS = 5


class ScaledLearningRate(KerascaleCallback):
    """Scales the optimizer's learning rate for `batch_size`, from the batch
    it was chosen at (`base_batch_size`, Keras's 32 by default), by the rule
    that fits the optimizer, and puts it back when `fit` ends (or raises).

    - SGD: linear, `batch_size / base_batch_size`, reached over a warmup of
      `warmup_epochs` epochs from your rate (Goyal et al., "Accurate, Large
      Minibatch SGD", 2017).
    - Adam, AdamW, Adamax, Nadam, RMSprop, Adagrad, Adadelta, Adafactor,
      Lamb, Ftrl: square root, `sqrt(batch_size / base_batch_size)`, from
      the first step (Malladi et al., "On the SDEs and Scaling Rules for
      Adaptive Gradient Algorithms", 2022).
    - Others (Lion, Muon, a `MultiOptimizer`...), or a learning rate that is
      a schedule or a function: no rule is known, so the rate is left as it
      is, with one warning.

    It sets the rate when training begins and, during a warmup, at each
    epoch's beginning; after the warmup it never sets it again, so a
    `ReduceLROnPlateau` of yours acts on the scaled rate as it would on
    yours. `kerascale.find_batch_size(...).fit_kwargs(model)` adds it for the
    batch it found. With a checkpoint callback in a plain `model.fit`, put
    this one first in `callbacks`: a resume then restores the rate the
    checkpoint saved, already scaled (`kerascale.fit` orders its own backup
    last).

    Args:
        batch_size: The batch you train at (all replicas).
        base_batch_size: The batch your learning rate was chosen at.
            Defaults to 32 (Keras's default batch).
        warmup_epochs: Epochs over which the linear rule reaches its rate:
            "auto" (default): a tenth of the run, 1 to 5 epochs; 0 for
            none. The square-root rule has no warmup.
        verbose: 1 (default): print one line with the factor and the rule;
            0: silent.

    Example:

    >>> scale = kerascale.callbacks.ScaledLearningRate(batch_size=256)
    >>> model.fit(x, y, batch_size=256, epochs=10, callbacks=[scale])
    """

    # It sets the learning rate: kerascale's batch lever keeps the batch.
    sets_learning_rate = True

    def __init__(
        self,
        batch_size: int,
        base_batch_size: int = 32,
        warmup_epochs: int | str = "auto",
        verbose: int = 1,
    ):
        super().__init__()
        v.positive_int("batch_size", batch_size)
        v.positive_int("base_batch_size", base_batch_size)
        if warmup_epochs != "auto":
            v.int_at_least("warmup_epochs", warmup_epochs, 0)
        if verbose not in (0, 1) or not isinstance(verbose, int):
            raise v.fail("verbose", verbose, "0 or 1")
        self.batch_size, self.base_batch_size = batch_size, base_batch_size
        self.warmup_epochs, self.verbose = warmup_epochs, verbose
        self.factor = 1.0  # the rule's factor at batch_size; 1.0 if none
        self.applied = 1.0  # what the rate is multiplied by now
        self.rule: goodput.LearningRateRule | None = None
        self._rate = None
        self._base_value = None
        self._warmup = 0

    def on_train_begin(self, logs=None):
        self.start_run().watch(self.release)
        self.applied, self._rate = 1.0, None
        optimizer = getattr(self.model, "optimizer", None)
        self.rule = goodput.rule_of(optimizer) if optimizer is not None else None
        if self.rule is None:
            name = type(optimizer).__name__ if optimizer is not None else "none"
            warn(
                f"ScaledLearningRate left the learning rate as it is: no rule is "
                f"known for your optimizer ({name}). Scale it yourself for "
                f"batch {self.batch_size}, or remove the callback."
            )
            return
        rate = keras_compat.learning_rate_object(core_optimizer(optimizer))
        if not isinstance(rate, keras.Variable):
            warn(
                "ScaledLearningRate left the learning rate as it is: it is a "
                "schedule or a function, which counts steps at your batch. "
                "Scale the schedule's rates yourself, or pass a number."
            )
            return
        self.factor = self.rule.factor(self.batch_size, self.base_batch_size)
        if self.factor == 1.0:
            return
        self._rate, self._base_value = rate, float(rate.numpy())
        self._warmup = self._warmup_epochs() if self.rule.warmup else 0
        self._set(self._multiplier(0))
        if self.verbose:
            warmup = (
                f", reached over {self._warmup} epoch(s) of warmup"
                if self._warmup
                else ""
            )
            print(
                f"kerascale: learning rate x{self.factor:.3g} of yours for batch "
                f"{self.batch_size} (from {self.base_batch_size}; "
                f"{self.rule.why}){warmup}"
            )

    def on_epoch_begin(self, epoch, logs=None):
        if self._rate is not None and self._warmup and epoch <= self._warmup:
            # Set absolutely during the warmup: a resume at epoch `epoch`
            # gets the warmup's rate there, whatever a checkpoint held.
            multiplier = self._multiplier(epoch)
            self._rate.assign(self._base_value * multiplier)
            self.applied = multiplier

    def on_train_end(self, logs=None):
        self.release()

    def release(self) -> None:
        """Puts your learning rate back (divides out the factor applied),
        keeping what else changed it during the run (a `ReduceLROnPlateau`)."""
        if self._rate is not None and self.applied != 1.0:
            self._rate.assign(float(self._rate.numpy()) / self.applied)
        self.applied, self._rate = 1.0, None
        super().release()

    def _warmup_epochs(self) -> int:
        if self.warmup_epochs != "auto":
            return self.warmup_epochs
        epochs = (self.params or {}).get("epochs") or 10
        return max(1, min(MAX_WARMUP_EPOCHS, round(WARMUP_SHARE * epochs)))

    def _multiplier(self, epoch: int) -> float:
        if not self._warmup:
            return self.factor
        return 1.0 + (self.factor - 1.0) * min(1.0, epoch / self._warmup)

    def _set(self, multiplier: float) -> None:
        self._rate.assign(float(self._rate.numpy()) * multiplier / self.applied)
        self.applied = multiplier
