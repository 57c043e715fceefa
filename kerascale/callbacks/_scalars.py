"""A TensorBoard writer for one run's scalars, and the `log_dir` argument."""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from kerascale import _validation as v


class Scalars:
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


def optional_dir(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise v.fail(name, value, "a directory path (str or os.PathLike) or None")
    return value
