"""`GPUMonitor`: utilisation, memory and power of each GPU, through NVML."""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
import time

from kerascale import _validation as v
from kerascale.callbacks._base import KerascaleCallback
from kerascale.callbacks._scalars import Scalars, optional_dir
from kerascale.errors import warn
from kerascale.sense.nvml import visible_nvml_handles

logger = logging.getLogger("kerascale")

# Why a GPUMonitor did not monitor, each said once in a process: a tuner
# copies the callback for every trial.
_SAID: set[str] = set()


class GPUMonitor(KerascaleCallback):
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
        self._scalars = Scalars(optional_dir("log_dir", log_dir))
        self.interval = v.duration(
            "interval", interval, accepted="seconds > 0 (a number)"
        )
        self.active = False
        self.reason: str | None = None  # why it is not active
        self.samples: list[tuple[float, int, float, float, float]] = []

    def __deepcopy__(self, memo: dict) -> GPUMonitor:
        # keras-tuner copies callbacks per trial; a monitor that has run
        # holds a lock, an event and NVML's handles, which do not copy, and
        # a copy starts with none of them.
        return GPUMonitor(self._scalars.log_dir, self.interval)

    def on_train_begin(self, logs=None):
        self.start_run()
        self.samples = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, ...
            return self._inactive(f"NVML is not available ({type(e).__name__}: {e})")
        try:
            handles = visible_nvml_handles(pynvml)
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
        if reason not in _SAID:
            _SAID.add(reason)
            warn(
                f"GPUMonitor is not monitoring: {reason}. It reads GPUs through "
                "NVML (`pip install nvidia-ml-py` and an NVIDIA driver); training "
                "goes on without it."
            )

    def _run(self) -> None:
        run = self.run
        while not self._stop.wait(self.interval):
            if run is None or not run.alive():
                # Its fit raised (Keras then skips on_train_end): stop here.
                self._shut_down()
                return
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
        self.release()

    def release(self) -> None:
        """Stops the sampling thread and shuts NVML down."""
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 * self.interval + 1)
        self._shut_down()
        self._scalars.close()
        super().release()

    def _shut_down(self) -> None:
        if self.active:
            self.active = False
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
