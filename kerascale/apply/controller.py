"""One place that watches a run and changes its settings at epoch ends:
Keras's `fit` runs in segments, one per setting, that your callbacks see as
one run.

Each setting is a `Lever`: a callback that measures inside the run and, at
an epoch's end, may ask for new `fit` arguments for the rest of it. The
controller then ends that `fit` at the epoch's end (as `EarlyStopping`
does) and calls it again from the next epoch with the new arguments. Your
callbacks get `on_train_begin` once, before the first epoch, and
`on_train_end` once, after the last, as in one `fit`; `History` is one,
holding every epoch. A stop that any callback asks for ends the run: no
lever asks once the model is stopping, nor at the run's last epoch.

Its design: docs/design/modules.md, `kerascale.apply.controller`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras

from kerascale._keras_compat import epoch_order
from kerascale.errors import warn

_QUIET_HOOKS = ("on_train_begin", "on_train_end")


class Lever(keras.callbacks.Callback):
    """A setting that the run itself measures. Subclasses measure in the
    hooks they need and answer `propose` at each epoch's end."""

    # Its hooks only read clocks and the epoch's logs: no step waits on them.
    async_safe = True
    # The settings of its proposals that are not `fit` arguments: the lever
    # applies them itself in `changed` (a model's steps per call).
    own: tuple[str, ...] = ()

    def propose(self, epoch: int, logs: dict | None) -> Mapping[str, Any] | None:
        """`fit` arguments for the epochs after `epoch` (the batch, say),
        or None to keep the run as it is."""
        return None

    def changed(self, arguments: Mapping[str, Any]) -> None:
        """The run goes on with `arguments` (this lever's proposal)."""

    def undone(self, arguments: Mapping[str, Any], error: BaseException) -> str:
        """The first step under `arguments` (this lever's last change) raised
        `error`, and the run goes on as it was before it: put back what
        `changed` did, propose nothing more, and say in words what was
        dropped."""
        return f"{dict(arguments)} failed ({type(error).__name__}: {error})"

    def finish(self) -> None:
        """The run is over, however it ended: put back whatever the lever
        changed outside `fit`'s arguments (a learning rate)."""


class Controller:
    """Runs `fit` in segments at the levers' asking.

    Args:
        levers: The levers, asked in order at each epoch's end.
        callbacks: The run's other callbacks, which see one run.
    """

    def __init__(self, levers: list[Lever], callbacks: list[Any]):
        self.levers = list(levers)
        # Those still asked at epochs' ends (one that failed is not; every
        # lever still finishes).
        self.asked = list(levers)
        # Those that see one run: the levers too keep what they measured.
        self.callbacks = [*callbacks, *levers]
        # The next segment's first epoch, and each lever's change for it.
        self.pending: tuple[int, list[tuple[Lever, dict[str, Any]]]] | None = None
        self.changes: list[tuple[int, Mapping[str, Any]]] = []
        # Steps begun (by the tail, right before each step) and ended (by
        # the head, right after) in the current segment.
        self.begun = self.ended = 0
        # Called at each segment's start: keeps what `recover` puts back.
        self.keep: Callable[[], Any] | None = None
        # Told the arguments of each segment after the first (a callback
        # that counts samples follows the batch).
        self.followers: list[Callable[[Mapping[str, Any]], None]] = []
        # The data adapter's epoch counter where a segment ended (Keras
        # 3.16 seeds an epoch's shuffle from it; a new `fit` starts it over).
        self.counter: int | None = None
        controller = self

        class Head(keras.callbacks.Callback):
            """First in the list: its `on_train_end` runs before the
            others', and quiets theirs where the run goes on."""

            async_safe = True

            def on_train_begin(self, logs=None):
                controller.begun = controller.ended = 0
                if controller.keep is not None:
                    controller.keep()
                controller._continue_order()

            def on_epoch_begin(self, epoch, logs=None):
                controller._speak("on_train_begin")

            def on_train_batch_end(self, batch, logs=None):
                controller.ended += 1

            def on_train_end(self, logs=None):
                if controller.pending is not None:
                    controller._quiet("on_train_end")
                    adapter = epoch_order.adapter_of(epoch_order.fit_epoch_iterator())
                    controller.counter = epoch_order.counter(adapter)

        class Tail(keras.callbacks.Callback):
            """Last in the list: its `on_epoch_end` sees every other
            callback's decision (a stop) before asking the levers."""

            async_safe = True

            def on_train_batch_begin(self, batch, logs=None):
                controller.begun += 1

            def on_epoch_end(self, epoch, logs=None):
                controller._ask(self.model, self.params, epoch, logs)

        self.head, self.tail = Head(), Tail()

    def wrapped(self, callbacks: list[Any]) -> list[Any]:
        """`callbacks` (the run's, as `fit` gets them) with the controller's
        own around them, and the levers first among them: what a lever
        adds to an epoch's logs (the batch, the noise scale) is in the logs
        every other callback sees (a `CSVLogger`, a backup's `History`)."""
        return [self.head, *self.levers, *callbacks, self.tail]

    def _continue_order(self) -> None:
        """A segment after the first goes on with the epoch counter where
        the last one left it: the epochs are shuffled as in one `fit`
        (Keras 3.16, keras-team/keras#23046; up to 3.15 the order is the
        global random state's, which runs on by itself)."""
        if self.counter is not None:
            adapter = epoch_order.adapter_of(epoch_order.fit_epoch_iterator())
            epoch_order.set_counter(adapter, self.counter)

    def _ask(self, model: Any, params: dict, epoch: int, logs: dict | None) -> None:
        if model.stop_training or epoch + 1 >= params.get("epochs", 0):
            return
        proposals = []
        for lever in list(self.asked):
            try:
                proposal = lever.propose(epoch, logs)
            except Exception as e:  # a lever's fault never ends the run
                self.asked.remove(lever)
                warn(
                    f"Not applied: {type(lever).__name__}, because it failed "
                    f"({type(e).__name__}: {str(e)[:200]}): the run goes on as "
                    "it is, with what the lever already set."
                )
                continue
            if proposal:
                proposals.append((lever, dict(proposal)))
        if proposals:
            self.pending = (epoch + 1, proposals)
            model.stop_training = True

    def run(
        self,
        fit: Callable[[dict[str, Any]], Any],
        arguments: dict[str, Any],
        *,
        keep: Callable[[], Any] | None = None,
        recover: Callable[[], Any] | None = None,
        model: Any = None,
    ) -> Any:
        """Calls `fit(arguments)`, then again from the next epoch with the
        changes the levers ask for; returns one `History` of every epoch
        (also the model's `history`).

        Where the first step after a change raises (a larger batch that
        does not fit, say), `recover` puts the model's state back (as
        `keep` kept it at the segment's start), the epoch's changes are
        undone with one warning each, and the run goes on from the same
        epoch as it was: a change of kerascale's never ends a run that
        `fit` alone would have trained.

        `model`: the model `fit` trains. This frame is its run's for the
        callbacks that follow their `fit` call (`callbacks._base.FitRun`,
        which finds it by this name): one run across the segments."""
        segments_of = model  # noqa: F841 (read from the frame)
        self.keep = keep
        first = arguments
        history = None
        undo: tuple[list[tuple[Lever, dict[str, Any]]], dict[str, Any]] | None = None
        try:
            while True:
                try:
                    segment = fit(arguments)
                except Exception as e:
                    if undo is None or (self.begun, self.ended) != (1, 0):
                        raise  # not the first step at the new settings
                    if recover is not None:
                        recover()
                    proposals, arguments = undo
                    for lever, change in reversed(proposals):
                        warn(lever.undone(change, e))
                    self._tell(arguments)
                    self.changes.pop()
                    self._speak("on_train_begin")
                    self._quiet("on_train_begin")
                    undo = None
                    continue
                history = segment if history is None else _joined(history, segment)
                self._speak("on_train_end")
                if self.pending is None:
                    break
                start, proposals = self.pending
                self.pending = None
                before = {**arguments, "initial_epoch": start}
                arguments = dict(before)
                merged: dict[str, Any] = {}
                for lever, change in proposals:
                    lever.changed(change)
                    merged.update(change)
                    arguments.update(
                        {k: v for k, v in change.items() if k not in lever.own}
                    )
                self.changes.append((start, merged))
                undo = (proposals, before)
                self._tell(arguments)
                self._quiet("on_train_begin")
        finally:
            self._speak("on_train_begin")
            self._speak("on_train_end")
            if self.changes:
                self._tell(first)  # a follower ends as the run began
            self.pending = None
            for lever in self.levers:
                lever.finish()
        if history is not None and history.model is not None:
            history.model.history = history
        return history

    def _tell(self, arguments: Mapping[str, Any]) -> None:
        for follower in self.followers:
            follower(arguments)

    def _quiet(self, hook: str) -> None:
        for callback in self.callbacks:
            vars(callback)[hook] = _quiet

    def _speak(self, hook: str) -> None:
        for callback in self.callbacks:
            if vars(callback).get(hook) is _quiet:
                del vars(callback)[hook]


def _quiet(*args: Any, **kwargs: Any) -> None:
    """Stands in for a callback's `on_train_begin` or `on_train_end` between
    two segments of one run."""


def _joined(first: Any, later: Any) -> Any:
    """`first` History with `later`'s epochs after its own."""
    nan = float("nan")
    for key in set(first.history) | set(later.history):
        before = first.history.setdefault(key, [])
        before.extend([nan] * (len(first.epoch) - len(before)))
        before.extend(later.history.get(key, [nan] * len(later.epoch)))
    first.epoch.extend(later.epoch)
    first.params = later.params
    return first
