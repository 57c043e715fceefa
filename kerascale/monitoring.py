"""Callbacks that watch training: throughput, GPUs, a time budget, a profile.

Each is a plain Keras callback (exported from `kerascale.callbacks`), usable in
any `model.fit`; `kerascale.fit(log_dir=..., profile=..., time_budget=...)`
installs them. Scalars go to TensorBoard event files under
``<log_dir>/kerascale`` (``tensorboard --logdir <log_dir>``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from kerascale import _validation as v

logger = logging.getLogger("kerascale")


class _Scalars:
    """A TensorBoard writer for one run's scalars (created on first use)."""

    def __init__(self, log_dir: str | None):
        self.log_dir = log_dir
        self._writer = None

    def write(self, values: dict[str, float], step: int) -> None:
        if self.log_dir is None or not values:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                os.path.join(self.log_dir, "kerascale")
            )
        with self._writer.as_default():
            for name, value in values.items():
                tf.summary.scalar(name, value, step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _optional_dir(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise v.fail(name, value, "a directory path (str or os.PathLike) or None")
    return value


class Throughput(keras.callbacks.Callback):
    """Logs samples/s, step time (median and p90) and the ETA of each epoch.

    The figures are added to the epoch's logs (so they appear in `History`
    and the progress bar) and written as TensorBoard scalars under
    ``throughput/`` when `log_dir` is set. Step times are the intervals
    between batch starts, so they include waiting for input, and measuring
    them does not make Keras wait for each step's results.

    Args:
        batch_size: Samples per step, for samples/s. Defaults to `None`:
            steps/s only (`kerascale.fit` passes its plan's batch).
        log_dir: Where TensorBoard event files go. Defaults to `None`.

    Example:

    >>> model.fit(ds, epochs=5, callbacks=[kerascale.callbacks.Throughput(64)])
    >>> history.history["samples_per_second"]
    """

    def __init__(self, batch_size: int | None = None, log_dir: str | None = None):
        super().__init__()
        if batch_size is not None:
            v.positive_int("batch_size", batch_size, accepted="a positive int or None")
        self.batch_size = batch_size
        self._scalars = _Scalars(_optional_dir("log_dir", log_dir))
        self._clock: Callable[[], float] = time.perf_counter
        self.epochs_seen: list[dict[str, float]] = []

    def on_train_begin(self, logs=None):
        self.epochs_seen = []
        self._epoch_seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._intervals: list[float] = []
        self._last = None
        self._epoch_start = self._clock()

    def on_train_batch_begin(self, batch, logs=None):
        now = self._clock()
        if self._last is not None:
            self._intervals.append(now - self._last)
        self._last = now

    def on_epoch_end(self, epoch, logs=None):
        now = self._clock()
        if self._last is not None:
            self._intervals.append(now - self._last)
        steps = len(self._intervals)
        seconds = now - self._epoch_start
        if not steps or seconds <= 0:
            return
        self._epoch_seconds.append(seconds)
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        figures = {
            "steps_per_second": steps * spe / seconds,
            "step_time_median": statistics.median(self._intervals) / spe,
            "step_time_p90": _quantile(self._intervals, 0.9) / spe,
        }
        if self.batch_size:
            figures["samples_per_second"] = (
                figures["steps_per_second"] * self.batch_size
            )
        epochs = int(self.params.get("epochs") or 0)
        left = max(0, epochs - epoch - 1)
        # The first epoch includes tracing: leave it out of the ETA when we can.
        recent = self._epoch_seconds[1:] or self._epoch_seconds
        figures["eta_seconds"] = left * statistics.mean(recent)
        self.epochs_seen.append(figures)
        if logs is not None:
            logs.update(figures)
        self._scalars.write({f"throughput/{k}": x for k, x in figures.items()}, epoch)

    def on_train_end(self, logs=None):
        self._scalars.close()


class TimeBudget(keras.callbacks.Callback):
    """Stops training before a deadline, leaving time for a final checkpoint.

    It projects the finish time from measured epoch and step times, warns as
    soon as the run is projected to overrun the budget, and sets
    `model.stop_training` at the last batch boundary that leaves `reserve`
    seconds (plus the time an epoch's end took, when the next batch ends an
    epoch) before the deadline. With a `FaultTolerantBackup`, the run saves
    on the way out and a rerun continues at that batch.

    Args:
        budget: Seconds, or a string like "18h", "90min", "1h30min".
        reserve: Seconds kept free at the end for saving and exiting.
            Defaults to `None`: 2% of the budget, at least 1 s and at most
            5 minutes, plus twice the slowest checkpoint save seen (when
            `kerascale.fit` pairs it with its backup).
        clock: A seam for tests: a function returning seconds. Defaults to
            `time.monotonic`.

    Example:

    >>> model.fit(ds, epochs=1000, callbacks=[backup, TimeBudget("18h")])
    """

    def __init__(
        self,
        budget: float | str,
        *,
        reserve: float | None = None,
        clock: Callable[[], float] | None = None,
    ):
        super().__init__()
        self.budget = v.duration("budget", budget)
        if reserve is not None:
            if isinstance(reserve, bool) or not isinstance(reserve, (int, float)):
                raise v.fail("reserve", reserve, "seconds >= 0 (a number) or None")
            if not 0 <= reserve < self.budget:
                raise v.fail(
                    "reserve", reserve, f"seconds in [0, budget={self.budget:g})"
                )
        self.reserve = reserve
        if clock is not None and not callable(clock):
            raise v.fail("clock", clock, "a function returning seconds, or None")
        self._clock = clock or time.monotonic
        self.backup: Any = None  # a FaultTolerantBackup, to reserve its save time
        self.stopped_early = False
        self.projected_seconds: float | None = None

    def on_train_begin(self, logs=None):
        self._start = self._clock()
        self._epoch_seconds: list[float] = []
        self._step_seconds: float | None = None
        self._end_overhead = 0.0
        self._warned = False
        self.stopped_early = False
        self._last_batch_end: float | None = None
        self._epoch_steps = self.params.get("steps")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_start = self._clock()
        self._steps = 0
        if self._last_batch_end is not None:  # validation + epoch-end callbacks
            self._end_overhead = max(
                self._end_overhead, self._epoch_start - self._last_batch_end
            )

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = self._clock()

    def on_train_batch_end(self, batch, logs=None):
        now = self._clock()
        took = now - self._batch_start
        # A moving average: quick to follow a change, not fooled by one step.
        self._step_seconds = (
            took
            if self._step_seconds is None
            else 0.8 * self._step_seconds + 0.2 * took
        )
        self._last_batch_end = now
        self._steps = batch + 1
        next_ends_epoch = (
            self._epoch_steps is not None and batch + 2 >= self._epoch_steps
        )
        needed = self._step_seconds + (self._end_overhead if next_ends_epoch else 0.0)
        if now - self._start + needed + self._reserve() >= self.budget:
            self._stop(now, "the next step would not finish in time")

    def on_epoch_end(self, epoch, logs=None):
        now = self._clock()
        self._epoch_seconds.append(now - self._epoch_start)
        if self._epoch_steps is None:
            self._epoch_steps = self._steps
        epochs = int(self.params.get("epochs") or 0)
        left = max(0, epochs - epoch - 1)
        self.projected_seconds = (
            now
            - self._start
            + left * statistics.mean(self._epoch_seconds[1:] or self._epoch_seconds)
        )
        if self.projected_seconds > self.budget and not self._warned and left:
            self._warned = True
            logger.warning(
                "TimeBudget: at %s per epoch, %d epochs would end %s after the "
                "start, over the budget of %s; training will stop at about %s and "
                "can be resumed from its checkpoint.",
                _clock_text(statistics.mean(self._epoch_seconds)),
                epochs,
                _clock_text(self.projected_seconds),
                _clock_text(self.budget),
                _clock_text(self.budget - self._reserve()),
            )

    def _reserve(self) -> float:
        if self.reserve is not None:
            return self.reserve
        base = min(max(0.02 * self.budget, 1.0), 300.0)
        saves = getattr(self.backup, "save_seconds", None) or [0.0]
        return base + 2 * max(saves)

    def _stop(self, now: float, why: str) -> None:
        if self.model.stop_training:
            return
        self.model.stop_training = True
        self.stopped_early = True
        logger.warning(
            "TimeBudget: stopping after %s of the %s budget (%s); %s left for "
            "the final checkpoint.",
            _clock_text(now - self._start),
            _clock_text(self.budget),
            why,
            _clock_text(self.budget - (now - self._start)),
        )


class ProfileWindow(keras.callbacks.Callback):
    """Traces steps `start_step` to `stop_step` with `tf.profiler`.

    Steps count from 1 over the whole run (across epochs). The trace goes to
    ``<log_dir>/plugins/profile/<run>/``; view it in TensorBoard's Profile tab
    (``pip install tensorboard-plugin-profile``). Skip the first steps, which
    trace the model and warm tf.data up.

    Args:
        log_dir: Where the trace goes.
        start_step: The first traced step (>= 1).
        stop_step: The last traced step (>= start_step).

    Example:

    >>> model.fit(ds, callbacks=[ProfileWindow("logs", start_step=20, stop_step=25)])
    """

    def __init__(
        self, log_dir: str | os.PathLike, start_step: int = 10, stop_step: int = 15
    ):
        super().__init__()
        self.log_dir = _optional_dir("log_dir", log_dir)
        if self.log_dir is None:
            raise v.fail("log_dir", log_dir, "a directory path (str or os.PathLike)")
        self.start_step = v.positive_int("start_step", start_step)
        self.stop_step = v.positive_int("stop_step", stop_step)
        if stop_step < start_step:
            raise v.fail("stop_step", stop_step, f"an int >= start_step ({start_step})")
        self.traced: tuple[int, int] | None = None

    def on_train_begin(self, logs=None):
        self._step = 0
        self._running = False
        self.traced = None

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        if self._step == self.start_step and self.traced is None:
            try:
                tf.profiler.experimental.start(self.log_dir)
            except Exception as e:  # another profiler is running, ...
                logger.warning("ProfileWindow: cannot start the profiler: %s", e)
                self.traced = (0, 0)
                return
            self._running = True
            self._first = self._step

    def on_train_batch_end(self, batch, logs=None):
        if self._running and self._step >= self.stop_step:
            self._finish()

    def on_train_end(self, logs=None):
        if self._running:
            self._finish()

    def _finish(self) -> None:
        tf.profiler.experimental.stop()
        self._running = False
        self.traced = (self._first, self._step)
        logger.info(
            "ProfileWindow: traced steps %d-%d into %s",
            self._first,
            self._step,
            self.log_dir,
        )


class GPUMonitor(keras.callbacks.Callback):
    """Samples each visible GPU through NVML in a background thread.

    Every `interval` seconds it reads utilisation (%), memory used (bytes)
    and power (W). Each epoch's mean utilisation, peak memory and mean power
    per GPU go into the epoch's logs (``gpu0_utilization``, ...) and, with
    `log_dir`, into TensorBoard scalars under ``gpu/``. Without a GPU or NVML
    (the `nvidia-ml-py` package and a driver) it says so once and does
    nothing else.

    Args:
        log_dir: Where TensorBoard event files go. Defaults to `None`.
        interval: Seconds between samples (> 0). Defaults to 1.0.
    """

    def __init__(self, log_dir: str | None = None, interval: float = 1.0):
        super().__init__()
        self._scalars = _Scalars(_optional_dir("log_dir", log_dir))
        self.interval = v.duration(
            "interval", interval, accepted="seconds > 0 (a number)"
        )
        self.active = False
        self.reason: str | None = None  # why it is not active
        self.samples: list[tuple[float, int, float, float, float]] = []

    def on_train_begin(self, logs=None):
        from kerascale.hardware import _visible_nvml_indices

        self.samples = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, ...
            return self._inactive(f"NVML is not available ({type(e).__name__}: {e})")
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = []
            for key in _visible_nvml_indices(count):
                if isinstance(key, int):
                    if key < count:
                        handles.append(pynvml.nvmlDeviceGetHandleByIndex(key))
                else:
                    handles.append(pynvml.nvmlDeviceGetHandleByUUID(key))
        except Exception as e:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            return self._inactive(f"NVML could not list the GPUs ({e})")
        if not handles:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            return self._inactive("there is no GPU")
        self._nvml, self._handles = pynvml, handles
        self.active = True
        self._sample()  # one now, so even a short epoch has a figure
        self._thread = threading.Thread(
            target=self._run, name="kerascale-gpu", daemon=True
        )
        self._thread.start()
        self._epoch_from = 0
        return None

    def _inactive(self, reason: str) -> None:
        self.active = False
        self.reason = reason
        logger.info("GPUMonitor: %s; not monitoring.", reason)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        nvml, now = self._nvml, time.monotonic()
        rows = []
        for i, h in enumerate(self._handles):
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                mem = float(nvml.nvmlDeviceGetMemoryInfo(h).used)
                try:
                    power = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                except Exception:  # not supported on some boards
                    power = math.nan
            except Exception as e:
                logger.info("GPUMonitor: sampling GPU %d failed: %s", i, e)
                continue
            rows.append((now, i, util, mem, power))
        with self._lock:
            self.samples.extend(rows)

    def on_epoch_end(self, epoch, logs=None):
        if not self.active:
            return
        with self._lock:
            window = self.samples[self._epoch_from :]
            self._epoch_from = len(self.samples)
        figures = {}
        for i in sorted({row[1] for row in window}):
            rows = [r for r in window if r[1] == i]
            figures[f"gpu{i}_utilization"] = statistics.mean(r[2] for r in rows)
            figures[f"gpu{i}_memory_used"] = max(r[3] for r in rows)
            powers = [r[4] for r in rows if not math.isnan(r[4])]
            if powers:
                figures[f"gpu{i}_power_watts"] = statistics.mean(powers)
        if logs is not None:
            logs.update(figures)
        self._scalars.write({f"gpu/{k}": x for k, x in figures.items()}, epoch)

    def on_train_end(self, logs=None):
        if not self.active:
            return
        self._stop.set()
        self._thread.join(timeout=5 * self.interval + 1)
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
        self._scalars.close()
        self.active = False


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _clock_text(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


DEFAULT_LOG_DIR = "kerascale_logs"
DEFAULT_PROFILE_WINDOW = (10, 14)  # after tracing and tf.data's warm-up


def validate_fit_options(
    log_dir: Any, profile: Any, time_budget: Any
) -> tuple[str | None, tuple[int, int] | None, float | None]:
    """`kerascale.fit`'s monitoring arguments, checked at the door."""
    log_dir = _optional_dir("log_dir", log_dir)
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
    return log_dir, window, budget


def for_fit(
    log_dir: str | None,
    window: tuple[int, int] | None,
    budget: float | None,
    *,
    samples_per_step: int,
    gpus: int,
    backup: Any,
) -> list[keras.callbacks.Callback]:
    """The callbacks `kerascale.fit` installs for its monitoring arguments."""
    out: list[keras.callbacks.Callback] = []
    if log_dir is not None:
        out.append(Throughput(samples_per_step, log_dir))
        if gpus:
            out.append(GPUMonitor(log_dir))
    if window is not None:
        out.append(ProfileWindow(log_dir or DEFAULT_LOG_DIR, *window))
    if budget is not None:
        limit = TimeBudget(budget)
        limit.backup = backup
        out.append(limit)
    return out
