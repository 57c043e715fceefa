"""What the training input carries from one epoch to the next, which a rerun's
freshly made input lacks, and how to bring it back.

Its design: docs/design/modules.md, `kerascale.callbacks._input_source`.
"""

from __future__ import annotations

import base64
import inspect
from typing import Any

import keras
import numpy as np

from kerascale.callbacks._run_random import random_state, restore_random_state


class InputSource:
    """Follows the input `x` that `fit` trains on.

    Args:
        x: The training input as given to `fit`.
        host_iterated: Whether Keras iterates it in Python (JAX), so that a
            `tf.data` pipeline's shuffle seeds are not in any checkpoint.
    """

    def __init__(self, x: Any, *, host_iterated: bool):
        self._dataset = x if host_iterated and draws_seeds(x) else None
        self._py = x if _reshuffles(x) else None
        # Read again in the same order from the same random state: Keras
        # reads a PyDataset or a generator in Python, whatever the backend.
        self.replayable = isinstance(x, keras.utils.PyDataset) or inspect.isgenerator(x)
        self._states: list[str] = []  # each on_epoch_end call's random state
        self._made_before = 0  # iterators the restored run had made
        self._made = 0  # iterators this run's Keras made
        self._calls_at_start = 0  # on_epoch_end calls before this iterator
        if self._py is not None:
            real = self._py.on_epoch_end

            def on_epoch_end() -> None:
                self._states.append(_pack(random_state()))
                real()

            self._py.on_epoch_end = on_epoch_end

    def release(self) -> None:
        """Takes the `on_epoch_end` wrapper out of the user's PyDataset."""
        py, self._py = self._py, None
        if py is not None and "on_epoch_end" in vars(py):
            del py.on_epoch_end

    def new_iterator(self) -> None:
        """Keras made the iterator the next step reads."""
        self._made += 1
        self._calls_at_start = len(self._states)

    def record(self, used_up: bool) -> dict[str, Any] | None:
        """What a rerun needs, before its first iterator: for the epoch in
        progress, or (`used_up`) for the one after it."""
        if self._dataset is None and self._py is None:
            return None
        made = self._made_before + self._made - (0 if used_up else 1)
        calls = len(self._states) if used_up else self._calls_at_start
        return {"iterators": max(0, made), "epoch_ends": self._states[:calls]}

    def restore(self, record: dict[str, Any] | None) -> None:
        """Brings this run's fresh input to `record`, before Keras's first
        iterator of this run gives a batch."""
        if not record:
            return
        if self._dataset is not None:
            self._made_before = int(record["iterators"])
            for _ in range(self._made_before):
                iter(self._dataset)
        if self._py is not None:
            saved = list(record.get("epoch_ends") or [])
            done = len(self._states)  # this run's own calls (at fit's start)
            real = type(self._py).on_epoch_end
            for packed in saved[done:]:
                restore_random_state(_unpack(packed))
                real(self._py)
            self._states = saved[: max(done, len(saved))]


def draws_seeds(x: Any) -> bool:
    """Whether `x` is a `tf.data` pipeline whose iterators draw new seeds
    (a reshuffling shuffle, `Dataset.random`)."""
    from kerascale.sense import data_facts

    if not data_facts.is_dataset(x):
        return False
    from kerascale import _tf_compat as tfc

    return tfc.draws_seeds(x)


def _reshuffles(x: Any) -> bool:
    """Whether `x` is a PyDataset with an `on_epoch_end` of its own."""
    if not isinstance(x, keras.utils.PyDataset):
        return False
    own = type(x).on_epoch_end
    return own is not keras.utils.PyDataset.on_epoch_end


def _pack(state: dict[str, Any]) -> str:
    """A random state as a short string: the generators' words in base64."""
    version, keys, gauss = state["python"]
    name, np_keys, pos, has_gauss, cached = state["numpy"]
    words = np.asarray([*keys, *np_keys], dtype=np.uint32).tobytes()
    head = f"{version}|{gauss!r}|{name}|{pos}|{has_gauss}|{cached!r}|{len(keys)}"
    return head + "|" + base64.b64encode(words).decode("ascii")


def _unpack(packed: str) -> dict[str, Any]:
    version, gauss, name, pos, has_gauss, cached, n, words = packed.split("|")
    flat = np.frombuffer(base64.b64decode(words), dtype=np.uint32).tolist()
    n = int(n)
    return {
        "python": [int(version), flat[:n], None if gauss == "None" else float(gauss)],
        "numpy": [name, flat[n:], int(pos), int(has_gauss), float(cached)],
    }
