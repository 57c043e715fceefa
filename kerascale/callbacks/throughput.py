"""`Throughput`: samples/s, step time and ETA of each epoch."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from kerascale import _keras_compat as keras_compat
from kerascale import _tf
from kerascale import _validation as v
from kerascale.callbacks._base import KerascaleCallback, pauses
from kerascale.callbacks._scalars import Scalars, optional_dir
from kerascale.sense.model_facts import steps_per_call


class Throughput(KerascaleCallback):
    """Measures samples/s, step time (median and p90) and the ETA of each epoch.

    The figures are written as TensorBoard scalars under ``throughput/``
    when `log_dir` is set, and kept per epoch in `epochs_seen`
    (`summary()` prints them as a table). They stay out of Keras's progress
    line and `History`, whose losses and metrics they would drown in scales
    of 1e-2 to 1e4, unless `in_logs=True`. Step times are the intervals
    between batch starts, so they include waiting for input, and measuring
    them does not make Keras wait for each step's results. Beside a
    `FaultTolerantBackup`, each epoch also has the seconds its saves held
    training (`checkpoint_seconds`: the copy of the state, and waiting for a
    save still being written) and, of them, the waits
    (`checkpoint_wait_seconds`: a save came due before the one before it
    was written).

    Args:
        batch_size: Samples per step, for samples/s. Defaults to `None`:
            steps/s only (`kerascale.fit` passes its plan's batch).
        log_dir: Where TensorBoard event files go. Defaults to `None`.
        in_logs: Also add the figures to the epoch's logs (`History`, the
            progress line). Defaults to `None`: only where `log_dir` was
            given and TensorBoard cannot be written (no TensorFlow), so that
            the figures still go somewhere a run keeps.

    Example:

    >>> throughput = kerascale.callbacks.Throughput(64)
    >>> model.fit(ds, epochs=5, callbacks=[throughput])
    >>> print(throughput.summary())
    """

    def __init__(
        self,
        batch_size: int | None = None,
        log_dir: str | None = None,
        in_logs: bool | None = None,
    ):
        super().__init__()
        if batch_size is not None:
            v.positive_int("batch_size", batch_size, accepted="a positive int or None")
        if in_logs is not None:
            v.boolean("in_logs", in_logs)
        self.batch_size = batch_size
        self._scalars = Scalars(optional_dir("log_dir", log_dir))
        if in_logs is None:
            in_logs = log_dir is not None and not _tf.available()
        self.in_logs = in_logs
        self._clock: Callable[[], float] = time.perf_counter
        self.epochs_seen: list[dict[str, float]] = []
        # Each seen epoch's number as Keras prints it ("Epoch 3/10"): from 1,
        # and from where a resumed run starts.
        self.epoch_numbers: list[int] = []

    def on_train_begin(self, logs=None):
        self.start_run()
        self.epochs_seen = []
        self.epoch_numbers = []
        self._epoch_seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._intervals: list[float] = []
        self._last = None
        self._last_begin = 0
        self._epoch_start = self._clock()
        self._paused = pauses(self.model)

    def on_train_batch_begin(self, batch, logs=None):
        now = self._clock()
        if self._last is not None:
            self._intervals.append(now - self._last)
        self._last = now
        self._last_begin = batch

    def on_epoch_end(self, epoch, logs=None):
        now = self._clock()
        if self._last is not None:
            self._intervals.append(now - self._last)
        steps = len(self._intervals)
        seconds = now - self._epoch_start
        if not steps or seconds <= 0:
            return
        self._epoch_seconds.append(seconds)
        spe = steps_per_call(self.model)
        # The steps the epoch ran: its last call may run fewer than spe.
        last = keras_compat.last_step_of_call(self.params, self._last_begin + spe - 1)
        figures = {
            "steps_per_second": (last + 1) / seconds,
            "step_time_median": statistics.median(self._intervals) / spe,
            "step_time_p90": _quantile(self._intervals, 0.9) / spe,
        }
        if self.batch_size:
            figures["samples_per_second"] = (
                figures["steps_per_second"] * self.batch_size
            )
        paused = pauses(self.model)
        for what in ("checkpoint", "checkpoint_wait"):
            if what in paused:  # a backup took part in this fit
                held = paused[what] - self._paused.get(what, 0.0)
                figures[f"{what}_seconds"] = held
        epochs = int(self.params.get("epochs") or 0)
        left = max(0, epochs - epoch - 1)
        # The first epoch includes tracing: leave it out of the ETA when we can.
        recent = self._epoch_seconds[1:] or self._epoch_seconds
        figures["eta_seconds"] = left * statistics.mean(recent)
        self.epochs_seen.append(figures)
        self.epoch_numbers.append(epoch + 1)
        if logs is not None and self.in_logs:
            logs.update(figures)
        self._scalars.write({f"throughput/{k}": x for k, x in figures.items()}, epoch)

    def on_train_end(self, logs=None):
        self.release()

    def summary(self) -> str:
        """The figures of each epoch seen, as a table, each epoch numbered
        as Keras's progress line numbers it (from 1; a resumed run's from
        where it resumed)."""
        if not self.epochs_seen:
            return "Throughput: no epoch measured yet."
        saves = any("checkpoint_seconds" in f for f in self.epochs_seen)
        rows = ["epoch  samples/s   steps/s  step median  step p90    ETA"]
        if saves:
            rows[0] += "  saves held (waiting)"
        for epoch, f in zip(self.epoch_numbers, self.epochs_seen, strict=True):
            samples = f.get("samples_per_second")
            shown = "-" if samples is None else f"{samples:,.0f}"
            median, p90 = f["step_time_median"] * 1e3, f["step_time_p90"] * 1e3
            row = (
                f"{epoch:>5}  {shown:>9}  {f['steps_per_second']:>8.2f}"
                f"  {median:>8.1f} ms  {p90:>5.1f} ms  {f['eta_seconds']:>5.0f} s"
            )
            if saves:
                held = f.get("checkpoint_seconds", 0.0)
                waited = f.get("checkpoint_wait_seconds", 0.0)
                row += f"  {held:>8.2f} s ({waited:.2f} s)"
            rows.append(row)
        return "\n".join(rows)

    def release(self) -> None:
        """Closes the run's TensorBoard writer."""
        self._scalars.close()
        super().release()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
