"""`ProfileWindow`: a profiler trace of a window of training steps, for
TensorBoard's Profile tab: `tf.profiler` through Keras's `TensorBoard`
callback on TensorFlow, `jax.profiler` on JAX (no TensorFlow needed)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import keras

from kerascale import _validation as v
from kerascale.callbacks._base import KerascaleCallback
from kerascale.callbacks._scalars import optional_dir
from kerascale.errors import warn
from kerascale.sense import backend as backend_lib


class ProfileWindow(KerascaleCallback, keras.callbacks.TensorBoard):
    """Traces steps `start_step` to `stop_step` with `tf.profiler` (on JAX,
    `ProfileWindow(...)` is a `JaxProfileWindow`: `jax.profiler`).

    This is Keras's own `keras.callbacks.TensorBoard(profile_batch=(start,
    stop))`, which does the tracing, with what it lacks added: when `fit`
    raises inside the window (Keras then skips `on_train_end`), Keras's
    callback leaves the profiler running, so every later profile in the
    process traces nothing ("Another profiler is running"). This one stops
    the trace, and saves what it holds, within a fraction of a second of its
    `fit` ending, however it ends. Its arguments are also checked by name.

    Steps count from 1 over the whole run (across epochs); `traced` says which
    were traced. The trace goes to ``<log_dir>/train/plugins/profile/<run>/``;
    view it in TensorBoard's Profile tab (``pip install
    tensorboard-plugin-profile``). Keras's epoch scalars go to
    ``<log_dir>/train`` too. Skip the first steps, which trace the model and
    warm tf.data up.

    Args:
        log_dir: Where the trace goes.
        start_step: The first traced step (>= 1). Defaults to 10.
        stop_step: The last traced step (>= start_step). Defaults to 15.

    Example:

    >>> model.fit(ds, callbacks=[ProfileWindow("logs", start_step=20, stop_step=25)])
    """

    # Its window counts calls as steps (as Keras's TensorBoard does).
    steps_per_execution_safe = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is ProfileWindow and backend_lib.name() == "jax":
            return JaxProfileWindow(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self, log_dir: str | os.PathLike, start_step: int = 10, stop_step: int = 15
    ):
        directory = _validated(log_dir, start_step, stop_step)
        super().__init__(
            log_dir=directory,
            profile_batch=(start_step, stop_step),
            write_graph=False,
            update_freq="epoch",
        )
        self.start_step, self.stop_step = start_step, stop_step
        self.traced: tuple[int, int] | None = None  # the steps traced, once done
        self._lock = threading.Lock()
        self._watch: threading.Event | None = None
        self._step, self._first = 0, None

    def on_train_begin(self, logs=None):
        run = self.start_run()
        self.traced, self._step, self._first = None, 0, None
        super().on_train_begin(logs)
        self._watch = run.watch(self._finish)

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        super().on_train_batch_begin(batch, logs)
        if self._first is None and self.tracing:
            self._first = self._step

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self._first is not None and self.traced is None and not self.tracing:
            self.traced = (self._first, self._step)

    def on_train_end(self, logs=None):
        self.release()

    def release(self) -> None:
        """Stops a trace that is still running (saving it) and closes the
        TensorBoard writers: what Keras's `on_train_end` does."""
        if self._watch is not None:
            self._watch.set()
            self._watch = None
        self._finish()
        super().release()

    def _finish(self) -> None:
        with self._lock:
            if self.tracing and self.traced is None:
                self.traced = (self._first, self._step)
            if self.model is not None:
                keras.callbacks.TensorBoard.on_train_end(self)

    @property
    def tracing(self) -> bool:
        """Whether this callback's trace is running now."""
        return bool(getattr(self, "_is_tracing", False))

    def __deepcopy__(self, memo: dict) -> ProfileWindow:
        # keras-tuner copies callbacks per trial; locks and threads are not
        # copyable, and a copy starts with neither.
        return ProfileWindow(self.log_dir, self.start_step, self.stop_step)


def _validated(log_dir: Any, start_step: Any, stop_step: Any) -> str:
    directory = optional_dir("log_dir", log_dir)
    if directory is None:
        raise v.fail("log_dir", log_dir, "a directory path (str or os.PathLike)")
    v.positive_int("start_step", start_step)
    v.positive_int("stop_step", stop_step)
    if stop_step < start_step:
        raise v.fail("stop_step", stop_step, f"an int >= start_step ({start_step})")
    return directory


class JaxProfileWindow(KerascaleCallback):
    """Traces steps `start_step` to `stop_step` with `jax.profiler`, what
    `ProfileWindow(...)` gives on the JAX backend (no TensorFlow needed).

    The trace goes to ``<log_dir>/train/plugins/profile/<run>/`` (an
    ``.xplane.pb`` for TensorBoard's Profile tab, ``pip install
    tensorboard-plugin-profile``, and a Perfetto ``.trace.json.gz``). Steps
    count from 1 over the run; the window's last step is waited for before
    the trace stops, since JAX dispatches steps ahead of the device. When
    `fit` raises inside the window, the trace is stopped and saved within a
    fraction of a second, so later profiles in the process still work.

    On Python < 3.12 the profiler's Python tracer is off: Keras disables JAX
    profiling there altogether after segfaults (keras-team/keras#20450); the
    device and XLA host traces, which a step's time is in, are kept.
    """

    # Its window counts calls as steps (as Keras's TensorBoard does).
    steps_per_execution_safe = False

    def __init__(
        self, log_dir: str | os.PathLike, start_step: int = 10, stop_step: int = 15
    ):
        super().__init__()
        self.log_dir = _validated(log_dir, start_step, stop_step)
        self.start_step, self.stop_step = start_step, stop_step
        self.traced: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._step, self._first = 0, None

    @property
    def tracing(self) -> bool:
        return self._first is not None and self.traced is None

    def on_train_begin(self, logs=None):
        self.start_run().watch(self.release)
        self.traced, self._step, self._first = None, 0, None

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        if self._step == self.start_step and self.traced is None:
            import jax

            options = jax.profiler.ProfileOptions()
            if sys.version_info < (3, 12):
                options.python_tracer_level = 0
            try:
                jax.profiler.start_trace(
                    os.path.join(self.log_dir, "train"), profiler_options=options
                )
            except RuntimeError as e:  # another trace is running in the process
                self.traced = (0, 0)
                warn(
                    f"ProfileWindow: the profiler did not start ({e}); training "
                    "goes on untraced. Stop the other trace (jax.profiler."
                    "stop_trace()) to profile."
                )
                return
            self._first = self._step

    def on_train_batch_end(self, batch, logs=None):
        if self.tracing and self._step >= self.stop_step:
            import jax

            jax.block_until_ready(logs)  # the window's work, not only its dispatch
            self._stop()

    def on_train_end(self, logs=None):
        self.release()

    def release(self) -> None:
        """Stops a trace that is still running, saving it."""
        self._stop()
        super().release()

    def _stop(self) -> None:
        with self._lock:
            if self.tracing:
                import jax

                self.traced = (self._first, self._step)
                jax.profiler.stop_trace()

    def __deepcopy__(self, memo: dict) -> JaxProfileWindow:
        return JaxProfileWindow(self.log_dir, self.start_step, self.stop_step)
