"""SIGTERM, caught for one training run: a preemption becomes a flag the
training loop acts on at the next step boundary.

The handler is tied to the `fit` call it was installed for (`FitRun`). A
SIGTERM that arrives when that call is no longer running (it raised, and
Keras skipped `on_train_end`) is not the run's to handle: the handler takes
itself out and passes the signal to the handler that was there before, as if
it had never been installed.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

# What `signal.getsignal` returns: a handler, SIG_DFL or SIG_IGN, or None
# (one not installed from Python).
Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

logger = logging.getLogger("kerascale")


class SigtermWatch:
    """Catches SIGTERM while one training run is active (see the module doc).

    Attributes:
        requested: Whether SIGTERM arrived during the run.
        frame: The frame the signal interrupted, for the previous handler.
        previous: The handler installed before this one.
    """

    def __init__(self) -> None:
        self.requested = False
        self.frame: FrameType | None = None
        self.previous: Handler = None
        self._installed = False
        self._active: Callable[[], bool] | None = None

    def install(self, active: Callable[[], bool]) -> None:
        """Installs the handler; `active()` says whether the run is still
        running (and the signal therefore the run's to handle)."""
        self.requested, self.frame, self._active = False, None, active
        if not on_main_thread():
            logger.info(
                "FaultTolerantBackup: not on the main thread, so SIGTERM is not "
                "caught; checkpoints follow save_freq only."
            )
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN:
            return  # the application asked to ignore SIGTERM; respect it
        if self._installed:
            self.release()
            previous = signal.getsignal(signal.SIGTERM)
        self.previous = previous
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def release(self) -> None:
        """Puts the previous handler back (only the main thread can; elsewhere
        the handler stays, passing signals on, until the next release)."""
        if self._installed and on_main_thread():
            signal.signal(signal.SIGTERM, self.previous)
            self._installed = False

    def pass_on(self) -> None:
        """Calls the previous handler, as a preempted run's exit does."""
        if callable(self.previous):
            self.previous(signal.SIGTERM, self.frame)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._active is not None and self._active():
            self.requested, self.frame = True, frame
            return
        previous = self.previous
        self.release()
        deliver(previous, signum, frame)


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def deliver(handler: Handler, signum: int, frame: FrameType | None) -> None:
    """Passes a signal on to `handler` as if it had been installed alone."""
    if callable(handler):
        handler(signum, frame)
    elif handler in (signal.SIG_DFL, None):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
