"""Files for checkpoints and leases: a local path through `os`, a remote one
(``gs://...``, ``s3://...``, as Vertex AI's `AIP_CHECKPOINT_DIR` is) through
`tf.io.gfile`.

Local paths need no TensorFlow, so checkpoints work on Keras's JAX backend
without it. A remote path without TensorFlow installed raises one clear
error naming the install. Errors are `OSError` either way (TensorFlow's
`NotFoundError` is turned into `FileNotFoundError`), so callers catch one kind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import IO, Any

from kerascale._tf import INSTALL_HINT, loaded, tf


def is_local(path: str) -> bool:
    return "://" not in path


def _gfile(path: str) -> Any:
    try:
        return tf.io.gfile
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"{path} is a remote path, which kerascale reads and writes through "
            f"TensorFlow's file systems; TensorFlow is not installed. Install it "
            f"with `{INSTALL_HINT}`, or use a local directory (a mounted bucket, "
            "such as gcsfuse's /gcs/..., is local).",
            name="tensorflow",
        ) from None


@contextlib.contextmanager
def _os_errors() -> Iterator[None]:
    """TensorFlow's file errors as the `OSError`s `os` raises."""
    try:
        yield
    except Exception as e:
        errors = tf.errors if loaded() else None
        if errors is not None and isinstance(e, errors.NotFoundError):
            raise FileNotFoundError(str(e)) from e
        if errors is not None and isinstance(e, errors.OpError):
            raise OSError(str(e)) from e
        raise


def exists(path: str) -> bool:
    if is_local(path):
        return os.path.exists(path)
    with _os_errors():
        return bool(_gfile(path).exists(path))


def isdir(path: str) -> bool:
    if is_local(path):
        return os.path.isdir(path)
    with _os_errors():
        return bool(_gfile(path).isdir(path))


def listdir(path: str) -> list[str]:
    """Entry names, without a trailing slash."""
    if is_local(path):
        return os.listdir(path)
    with _os_errors():
        return [entry.rstrip("/") for entry in _gfile(path).listdir(path)]


def makedirs(path: str) -> None:
    if is_local(path):
        os.makedirs(path, exist_ok=True)
        return
    with _os_errors():
        _gfile(path).makedirs(path)


def rmtree(path: str) -> None:
    if is_local(path):
        shutil.rmtree(path)
        return
    with _os_errors():
        _gfile(path).rmtree(path)


def remove(path: str) -> None:
    if is_local(path):
        os.remove(path)
        return
    with _os_errors():
        _gfile(path).remove(path)


def rename(source: str, target: str) -> None:
    """Moves `source` onto `target`, replacing it (atomic on a local disk and
    for one object in a bucket)."""
    if is_local(source) and is_local(target):
        os.replace(source, target)
        return
    with _os_errors():
        _gfile(source).rename(source, target, overwrite=True)


def size(path: str) -> int:
    if is_local(path):
        return os.path.getsize(path)
    with _os_errors():
        return int(_gfile(path).stat(path).length)


@contextlib.contextmanager
def open_file(path: str, mode: str) -> Iterator[IO[Any]]:
    """`open(path, mode)` for a binary `mode` ("rb", "wb")."""
    if is_local(path):
        with open(path, mode) as f:
            yield f
        return
    with _os_errors(), _gfile(path).GFile(path, mode) as f:
        yield f
