"""A TensorBoard writer for one run's scalars, and the `log_dir` argument."""

from __future__ import annotations

import os
from typing import Any

from kerascale import _tf
from kerascale import _validation as v
from kerascale._tf import tf
from kerascale.errors import warn


class Scalars:
    """A TensorBoard writer for one run's scalars (created on first use)."""

    def __init__(self, log_dir: str | None):
        self.log_dir = log_dir
        self._writer = None

    def write(self, values: dict[str, float], step: int) -> None:
        if self.log_dir is None or not values:
            return
        if not _tf.available():
            warn(
                f"No TensorBoard scalars are written to {self.log_dir!r}: event "
                "files need TensorFlow, which is not installed (the figures are "
                f"still in History). `{_tf.INSTALL_HINT}` writes them."
            )
            self.log_dir = None
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
