"""Checkpoint storage for `FaultTolerantBackup`: publish, find, verify, prune.

Its design: docs/design/modules.md, `kerascale.callbacks.checkpoint_store`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kerascale import _fs, _pids

logger = logging.getLogger("kerascale")

FORMAT = "kerascale.backup/1"
META = "meta.json"
STATE_PREFIX = "state"
INCOMPLETE = ".incomplete"
_NAME = re.compile(r"^ckpt-(\d{8})$")
_MAX_EPOCH = 10**7  # a week of 1-second epochs is 6e5; beyond this is damage
_DATA_MODES = ("iterator", "next_epoch", "advance", "replay", "none")
_CHUNK = 1 << 22


# Writes a checkpoint's state files under a path prefix; returns the SHA-256
# of the files it hashed as it wrote them, by file name (others are hashed
# after), or None.
WriteState = Callable[[str], Mapping[str, str] | None]


class CorruptCheckpoint(Exception):
    """Internal: one checkpoint cannot be used; the message says why."""


@dataclasses.dataclass(frozen=True)
class Found:
    """A checkpoint directory and what is known about it."""

    number: int
    path: str
    state: str  # "complete" (has meta.json), "leftover" (a killed save), "damaged"


def name(number: int) -> str:
    return f"ckpt-{number:08d}"


def scan(directory: str) -> list[Found]:
    """The checkpoint directories under ``directory``, newest first."""
    if not _fs.isdir(directory):
        return []
    found = []
    for entry in _fs.listdir(directory):
        match = _NAME.match(entry.rstrip("/"))
        if not match:
            continue
        path = _join(directory, entry.rstrip("/"))
        if not _fs.isdir(path):
            continue
        files = set(_fs.listdir(path))
        if META in files:
            state = "complete"
        elif INCOMPLETE in files or not files:
            state = "leftover"
        else:
            state = "damaged"
        found.append(Found(int(match.group(1)), path, state))
    return sorted(found, key=lambda f: f.number, reverse=True)


def opened(directory: str, *, chief: bool) -> tuple[list[Found], int]:
    """The checkpoints under `directory` (leftovers of saves killed before
    their commit removed, by the chief), and the next save's number."""
    existing = scan(directory) if _fs.exists(directory) else []
    if chief:
        for path in remove_leftovers(directory):
            logger.info("Removed %s, a save that was interrupted.", path)
    usable = [f for f in existing if f.state != "leftover"]
    return usable, 1 + max((f.number for f in existing), default=0)


def remove_leftovers(directory: str) -> list[str]:
    """Removes directories of saves that were killed before their commit."""
    removed = []
    for f in scan(directory):
        if f.state == "leftover":
            _fs.rmtree(f.path)
            removed.append(f.path)
    return removed


def publish(
    directory: str,
    number: int,
    write_state: WriteState,
    meta: dict[str, Any],
    before_commit: Callable[[], None] | None = None,
) -> str:
    """Writes checkpoint ``number``: the state, then ``meta.json`` as commit.

    ``write_state(prefix)`` writes TensorFlow's files under ``prefix``;
    ``before_commit()`` may raise to stop the commit (a lost lease).
    Returns the checkpoint's directory.
    """
    path = _join(directory, name(number))
    _fs.makedirs(path)
    write_bytes(_join(path, INCOMPLETE), b"")
    if is_local(path):
        files = _write_local(path, write_state)
    else:
        files = _write_remote(path, write_state)
    if before_commit is not None:
        before_commit()
    record = dict(meta, format=FORMAT, number=number, files=files)
    record["checksum"] = _checksum(record)
    temp = _join(path, f"{META}.tmp-{uuid.uuid4().hex}")
    write_bytes(temp, json.dumps(record, indent=1, sort_keys=True).encode())
    _fsync(temp)
    _fs.rename(temp, _join(path, META))
    _fsync_dir(path)
    _fs.remove(_join(path, INCOMPLETE))
    return path


def commit(
    directory: str,
    number: int,
    write_state: WriteState,
    meta: dict[str, Any],
    *,
    chief: bool,
    keep: int,
    spare: frozenset[str] = frozenset(),
    before_commit: Callable[[], None] | None = None,
) -> str:
    """One worker's part in checkpoint ``number``: the chief publishes it in
    ``directory`` and prunes to ``keep`` (sparing ``spare``, the damaged
    ones); another worker takes part in the write (its collective ops)
    into a directory of its own, removed after. Returns where it went."""
    if not chief:
        with _pids.own_directory("kerascale-worker-") as tmp:
            return publish(tmp, number, write_state, meta)
    path = publish(directory, number, write_state, meta, before_commit)
    prune(directory, keep, spare)
    return path


def _write_local(path: str, write_state: WriteState) -> dict[str, Any]:
    """The state is written into the checkpoint's directory; each file is
    then flushed to disk, and hashed from the bytes just written (the OS's
    page cache: no disk read) unless it was hashed as it was written."""
    hashed = write_state(_join(path, STATE_PREFIX)) or {}
    files = {}
    for entry in sorted(os.listdir(path)):
        if entry == INCOMPLETE or not entry.startswith(STATE_PREFIX):
            continue
        full = _join(path, entry)
        _fsync(full)
        digest = hashed.get(entry) or _sha256(full)
        files[entry] = {"bytes": os.path.getsize(full), "sha256": digest}
    return files


def _write_remote(path: str, write_state: WriteState) -> dict[str, Any]:
    """TensorFlow writes into a local staging directory; each file is hashed
    as it is uploaded. Nothing is read back from the remote store."""
    import tempfile

    files = {}
    with tempfile.TemporaryDirectory(prefix="kerascale-staging-") as staging:
        write_state(os.path.join(staging, STATE_PREFIX))
        for entry in sorted(os.listdir(staging)):
            if not entry.startswith(STATE_PREFIX):
                continue
            digest, size = hashlib.sha256(), 0
            with (
                open(os.path.join(staging, entry), "rb") as source,
                _fs.open_file(_join(path, entry), "wb") as target,
            ):
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    target.write(chunk)
                    size += len(chunk)
            files[entry] = {"bytes": size, "sha256": digest.hexdigest()}
    return files


def verify(found: Found) -> dict[str, Any]:
    """Returns the checkpoint's metadata, or raises CorruptCheckpoint."""
    meta_path = _join(found.path, META)
    if found.state != "complete":
        raise CorruptCheckpoint(f"{meta_path} is missing")
    try:
        with _fs.open_file(meta_path, "rb") as f:
            raw = f.read()
        record = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CorruptCheckpoint(f"{meta_path} is not readable JSON ({e})") from None
    if not isinstance(record, dict):
        raise CorruptCheckpoint(f"{meta_path} is not a JSON object")
    if record.get("checksum") != _checksum(record):
        raise CorruptCheckpoint(f"{meta_path} fails its checksum (edited or damaged)")
    _check_schema(record, meta_path)
    if record["number"] != found.number:
        raise CorruptCheckpoint(f"{meta_path} belongs to checkpoint {record['number']}")
    for entry, expected in record["files"].items():
        full = _join(found.path, entry)
        if not _fs.exists(full):
            raise CorruptCheckpoint(f"{full} is missing")
        size = _fs.size(full)
        if size != expected["bytes"]:
            raise CorruptCheckpoint(
                f"{full} has {size} bytes; {expected['bytes']} were written"
            )
        if _sha256(full) != expected["sha256"]:
            raise CorruptCheckpoint(f"{full} does not match its recorded SHA-256")
    return record


def verified(
    candidates: list[Found], on_damaged: Callable[[Found, str], None] | None = None
) -> Iterator[tuple[Found, dict[str, Any]]]:
    """(checkpoint, its metadata) for each candidate that passes `verify`,
    newest first, skipping killed saves; `on_damaged(found, why)` hears of the
    others."""
    for found in candidates:
        if found.state == "leftover":
            continue
        try:
            meta = verify(found)
        except CorruptCheckpoint as e:
            if on_damaged is not None:
                on_damaged(found, str(e))
            continue
        yield found, meta


def prune(directory: str, keep: int, spare: frozenset[str] = frozenset()) -> list[str]:
    """Keeps the newest ``keep`` complete checkpoints; removes older ones.

    Only ever called right after a publish, so the newest checkpoint is
    known good. Damaged checkpoints (a missing ``meta.json``, or the paths in
    ``spare``, found damaged when resuming) are never removed and never
    counted: they stay for the user to inspect.
    """
    found = [
        f for f in scan(directory) if f.state == "complete" and f.path not in spare
    ]
    complete = found
    if len(complete) <= keep:
        return []
    oldest_kept = complete[keep - 1].number
    removed = []
    for f in found:
        if f.number < oldest_kept:
            _fs.rmtree(f.path)
            removed.append(f.path)
    return removed


def state_prefix(found: Found) -> str:
    return _join(found.path, STATE_PREFIX)


def _check_schema(record: dict[str, Any], where: str) -> None:
    def need(key: str, kind: type | tuple[type, ...], what: str) -> Any:
        if key not in record:
            raise CorruptCheckpoint(f"{where} has no {key!r}")
        value = record[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(
            value, kind
        ):
            raise CorruptCheckpoint(f"{where}: {key!r} must be {what}; found {value!r}")
        return value

    if need("format", str, "a string") != FORMAT:
        raise CorruptCheckpoint(f"{where}: unknown format {record['format']!r}")
    for key in ("number", "epoch", "step", "global_step", "iterations"):
        value = need(key, int, "an int")
        if not 0 <= value <= (_MAX_EPOCH if key == "epoch" else 2**62):
            raise CorruptCheckpoint(f"{where}: {key!r} is out of range: {value!r}")
    epoch_steps = record.get("epoch_steps")
    if epoch_steps is not None and (
        isinstance(epoch_steps, bool)
        or not isinstance(epoch_steps, int)
        or epoch_steps < 1
    ):
        raise CorruptCheckpoint(f"{where}: 'epoch_steps' must be null or an int >= 1")
    if epoch_steps is not None and record["step"] > epoch_steps:
        raise CorruptCheckpoint(f"{where}: step {record['step']} > epoch_steps")
    need("epochs", int, "an int")
    need("finished", bool, "true or false")
    data = need("data", dict, "an object")
    if data.get("mode") not in _DATA_MODES:
        raise CorruptCheckpoint(f"{where}: unknown data mode {data.get('mode')!r}")
    need("fingerprint", dict, "an object")
    for key in ("plan", "history"):
        if record.get(key) is not None and not isinstance(record[key], dict):
            raise CorruptCheckpoint(f"{where}: {key!r} must be an object or null")
    history = record.get("history") or {"epoch": [], "logs": {}}
    if not isinstance(history.get("epoch"), list) or not isinstance(
        history.get("logs"), dict
    ):
        raise CorruptCheckpoint(f"{where}: 'history' is malformed")
    random_state = need("random", dict, "an object")
    for key in ("python", "numpy"):
        if key not in random_state:
            raise CorruptCheckpoint(f"{where}: 'random' has no {key!r}")
    files = need("files", dict, "an object")
    if not files:
        raise CorruptCheckpoint(f"{where} lists no state files")
    for entry, info in files.items():
        if (
            not isinstance(entry, str)
            or "/" in entry
            or "\\" in entry
            or not entry.startswith(STATE_PREFIX)
            or not isinstance(info, dict)
            or not isinstance(info.get("bytes"), int)
            or not isinstance(info.get("sha256"), str)
        ):
            raise CorruptCheckpoint(f"{where}: bad file entry {entry!r}")


def _checksum(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with _fs.open_file(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_bytes(path: str, data: bytes) -> None:
    with _fs.open_file(path, "wb") as f:
        f.write(data)


is_local = _fs.is_local


def _fsync(path: str) -> None:
    """Flushes a local file to disk, so a power cut cannot reorder the commit
    before the data (a killed process loses nothing already written)."""
    if is_local(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(path: str) -> None:
    if is_local(path) and hasattr(os, "O_DIRECTORY"):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _join(*parts: str) -> str:
    return "/".join([parts[0].rstrip("/"), *parts[1:]])
