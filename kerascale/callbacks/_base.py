"""What every kerascale callback shares: knowing which `fit` call it serves,
and undoing what it changed at any moment.

Its design: docs/design/modules.md, `kerascale.callbacks._base`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import keras

from kerascale.errors import warn

logger = logging.getLogger("kerascale")


# The seconds each kerascale callback has held the training thread, by model
# and by what it did ("checkpoint": a backup's saves), so that `Throughput`
# can say what share of an epoch they took.
_PAUSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def paused(model: Any, what: str, seconds: float) -> None:
    """Records that the training thread of `model`'s `fit` was held for
    `seconds` by `what`."""
    # A model that cannot be weakly referenced: nobody can ask for it.
    with contextlib.suppress(TypeError):
        _PAUSES.setdefault(model, collections.Counter())[what] += seconds


def pauses(model: Any) -> dict[str, float]:
    """The seconds `model`'s training thread has been held so far, by what
    held it (a running total: read it twice for a span)."""
    try:
        return dict(_PAUSES.get(model, {}))
    except TypeError:
        return {}


class FitRun:
    """The Keras `fit` call a callback serves, and whether it still runs.

    Holds that call's frame (frames cannot be weakly referenced) until
    `end()`; when no `fit` of the model is on the stack (a custom training
    loop calling the hooks itself), the run counts as running until `end()`.
    """

    def __init__(self, model: Any):
        self.thread = threading.get_ident()
        self._frame = _fit_frame(model)
        self._open = True

    def alive(self) -> bool:
        """Whether the `fit` call is still running (from any thread)."""
        if not self._open:
            return False
        if self._frame is None:
            return True
        if threading.get_ident() == self.thread:
            frame = sys._getframe(1)
        else:
            frame = sys._current_frames().get(self.thread)
        while frame is not None:
            if frame is self._frame:
                return True
            frame = frame.f_back
        return False

    def end(self) -> None:
        """The run is over: forget its frame."""
        self._open = False
        self._frame = None

    def watch(
        self, on_end: Callable[[], None], interval: float = 0.2
    ) -> threading.Event:
        """Calls `on_end()` from a daemon thread once the `fit` call has
        ended without `end()` (raised); returns the thread's stop event."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                if not self._open:
                    return
                if not self.alive():
                    try:
                        on_end()
                    except Exception as e:  # a thread's error would go unseen
                        warn(f"Cleaning up after a fit that raised failed: {e}")
                    return

        threading.Thread(target=run, name="kerascale-fit-watch", daemon=True).start()
        return stop

    def __deepcopy__(self, memo: dict) -> FitRun:
        # keras-tuner deep-copies callbacks; a copy serves no run yet.
        copy = FitRun.__new__(FitRun)
        copy.thread, copy._frame, copy._open = self.thread, None, False
        return copy


def _fit_frame(model: Any) -> Any:
    """The frame of the run on the current call stack: the innermost frame of
    `model.fit`, or the frame of the controller that runs it in segments
    (`apply.controller.Controller.run`, which marks the model it trains as
    `segments_of`): its callbacks serve one run across every segment's
    `fit`. None where neither is found."""
    found = None
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_name  # the locals are read of these frames only
        if name == "fit" and found is None and frame.f_locals.get("self") is model:
            found = frame
        elif name == "run" and frame.f_locals.get("segments_of") is model:
            return frame
        frame = frame.f_back
    return found


class KerascaleCallback(keras.callbacks.Callback):
    """A plain Keras callback that can also undo, at any moment, what it
    changed in the process (`release`), and knows the `fit` call it serves
    (`self.run`, set by `start_run` in `on_train_begin`)."""

    run: FitRun | None = None
    # Keeps its meaning where a call runs several steps (Keras's
    # steps_per_execution): it counts the steps a call ran, not the calls.
    steps_per_execution_safe = True

    def start_run(self) -> FitRun:
        """Releases what an earlier run of this callback left behind, and
        ties this one to the `fit` call now running."""
        self.release()
        self.run = FitRun(self.model)
        return self.run

    def release(self) -> None:
        """Undoes what this callback changed in the process, now. Idempotent,
        safe at any moment; `kerascale.fit` calls it on every exit."""
        if self.run is not None:
            self.run.end()
