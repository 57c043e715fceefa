"""`Prefetch`: the host out of the accelerator's way on JAX.

Its design: docs/design/modules.md, `kerascale.callbacks.prefetch`.
"""

from __future__ import annotations

from typing import Any

from kerascale import _validation as v
from kerascale.apply.jax.reader import DEPTH, ReadAhead
from kerascale.callbacks._base import KerascaleCallback
from kerascale.callbacks._input_position import Wrapped
from kerascale.errors import UnsupportedError
from kerascale.sense import backend as backend_lib


class Prefetch(KerascaleCallback):
    """Reads the next batches on a thread while the current step runs (JAX).

    The same batches in the same order as plain `fit`: it reads Keras's own
    iterator ahead of the step. `kerascale.fit` installs it on JAX unless
    ``optimize_data=False``; in a plain `model.fit`, put it in `callbacks`.
    With a `FaultTolerantBackup` it reads under the backup, in any order of
    `callbacks`, so a resume finds the input where the step left it.

    Args:
        depth: How many batches to hold ready (each on the devices, where
            Keras puts it). Defaults to 2.

    Example:

    >>> model.fit(x, y, batch_size=256, callbacks=[kerascale.callbacks.Prefetch()])
    """

    def __init__(self, depth: int = DEPTH):
        super().__init__()
        if backend_lib.name() == "tensorflow":
            raise UnsupportedError(
                "Prefetch reads Keras's JAX input iterator; on TensorFlow, "
                "tf.data's prefetch does this: use kerascale.fit (optimize_data "
                "adds prefetch(AUTOTUNE)) or ds.prefetch(tf.data.AUTOTUNE)."
            )
        self.depth = v.positive_int("depth", depth)
        self._keras_function: Any = None  # Keras's train function
        self._installed = False
        self._ahead: ReadAhead | None = None

    def on_train_begin(self, logs=None):
        self.start_run()
        holder, function = self._holder()
        self._keras_function = function
        self._ahead = ReadAhead(function, self.depth)
        if holder is None:
            self.model.train_function = self._step
        else:  # under a FaultTolerantBackup's wrapper: go inside it
            holder.real = self._step
        self._installed = True
        self.run.watch(self.release)

    def on_train_end(self, logs=None):
        self.release()

    def _holder(self) -> tuple[Any, Any]:
        """(the backup's wrapper holding Keras's function, or None; Keras's
        train function)."""
        function = self.model.train_function
        if isinstance(function, Wrapped):
            return function, function.real
        return None, function

    def _step(self, *args: Any) -> Any:
        """Keras's train function (JAX: `(state, iterator)`), reading its
        input on a thread."""
        ahead = self._ahead
        if ahead is None or not self._installed or not self.run.alive():
            self.release()  # its fit is over: hand over to Keras's own
            return self._keras_function(*args)
        return ahead(*args)

    def release(self) -> None:
        """Stops and joins the reading thread and puts Keras's train
        function back where this callback put itself."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()
        model = getattr(self, "_model", None)
        if self._installed and model is not None:
            self._installed = False
            holder, function = self._holder()
            if holder is not None and holder.real == self._step:
                holder.real = self._keras_function
            elif function == self._step:
                model.train_function = self._keras_function
        super().release()
