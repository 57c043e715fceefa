"""A materialized shard set on disk (`kerascale.apply.materialize`): its
fingerprint, writing, checking and reading.

Its design: docs/design/modules.md, `kerascale.apply.shard_files`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from typing import Any

import numpy as np

from kerascale import _fs, _pids
from kerascale import _tf_compat as tfc
from kerascale._tf import tf
from kerascale.sense import data_signature

logger = logging.getLogger("kerascale")

MANIFEST = "manifest.json"
FORMAT = 1  # the manifest's version
MAX_SHARDS = 16
_PARTIAL = ".partial-"
_GLOB = set("*?[")  # a string constant with these is a file pattern


def fingerprint(ds: Any) -> str:
    """What identifies the part written: its steps and their functions'
    graphs, its element spec and length (`data_signature.signature`), every
    constant it holds (file names, in-memory tensors), and the size and
    modification time of each file those name (globs expanded)."""
    h = hashlib.sha256(data_signature.signature(ds).encode())
    constants = _constants(ds)  # the pipeline's graph, serialized once
    for value in constants:
        h.update(value)
    for path in _files(constants):
        try:
            stat = os.stat(path)
            h.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        except OSError:
            h.update(f"{path}:missing".encode())
    return h.hexdigest()[:20]


def _constants(ds: Any) -> list[bytes]:
    """Every constant tensor of the pipeline's graph, serialized."""
    graph = tfc.dataset_graph(ds)
    return [
        node.attr["value"].tensor.SerializeToString()
        for node in graph.node
        if node.op == "Const" and "value" in node.attr
    ]


def _files(constants: list[bytes]) -> list[str]:
    """Local files the pipeline's string constants name, globs expanded."""
    from tensorflow.core.framework import tensor_pb2, types_pb2

    names = set()
    for raw in constants:
        proto = tensor_pb2.TensorProto()
        proto.ParseFromString(raw)
        if proto.dtype != types_pb2.DT_STRING:
            continue
        values = tf.io.parse_tensor(raw, tf.string).numpy()
        for value in np.ravel(values):
            text = value.decode("utf-8", "replace")
            if not text or len(text) > 4096 or not _fs.is_local(text):
                continue
            if _GLOB & set(text):
                names.update(tf.io.gfile.glob(text))
            elif os.path.isfile(text):
                names.add(text)
    return sorted(names)


def join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def trusted(
    path: str, key: str, prefix: Any, *, discard: bool = True
) -> dict[str, Any] | None:
    """The manifest of the set at `path`, where it can be trusted: written
    in full for this fingerprint and element spec, every file its size.
    A set that fails the check is removed (it would never be read), with
    `discard`."""
    manifest_path = join(path, MANIFEST)
    if not _fs.exists(manifest_path):
        if _fs.exists(path) and discard:
            _discard(path, "it has no manifest")
        return None
    try:
        with _fs.open_file(manifest_path, "rb") as f:
            manifest = json.loads(f.read().decode())
        problem = _mismatch(manifest, path, key, prefix)
    except (OSError, ValueError, KeyError, TypeError) as e:
        problem = f"its manifest cannot be read ({e})"
    if problem:
        if discard:
            _discard(path, problem)
        return None
    return manifest


def _mismatch(manifest: dict, path: str, key: str, prefix: Any) -> str:
    if manifest.get("format") != FORMAT or manifest.get("fingerprint") != key:
        return "its manifest is for another pipeline"
    if manifest.get("element_spec") != repr(prefix.element_spec):
        return "its element spec differs"
    for name, size in manifest["files"].items():
        file = join(path, name)
        if not _fs.exists(file) or _fs.size(file) != size:
            return f"{name} is missing or not the size it was written at"
    return ""


def _discard(path: str, why: str) -> None:
    logger.warning("kerascale: not reading the shard set %s: %s", path, why)
    try:
        _fs.rmtree(path)
    except OSError as e:
        logger.warning("kerascale: could not remove %s (%s)", path, e)


def write(prefix: Any, directory: str, key: str) -> dict[str, Any]:
    """Writes the set under a temporary name, then its manifest, then
    renames it into place; returns the manifest. Sets others left
    half-written by processes that are gone are removed first."""
    _fs.makedirs(directory)
    _sweep(directory)
    name = f"{_PARTIAL}{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    partial = join(directory, name)
    shards = _shards(prefix)
    data = join(partial, "data")
    try:
        prefix.enumerate().save(data, shard_func=lambda i, _: i % shards)
        files = _listing(partial)
        elements = int(tf.data.Dataset.load(data).cardinality())
        manifest = {
            "format": FORMAT,
            "fingerprint": key,
            "element_spec": repr(prefix.element_spec),
            "elements": elements,
            "shards": shards,
            "files": files,
        }
        with _fs.open_file(join(partial, MANIFEST), "wb") as f:
            f.write(json.dumps(manifest, indent=1).encode())
        final = join(directory, key)
        if _fs.exists(final):  # another process wrote it meanwhile
            _fs.rmtree(partial)
        else:
            _fs.rename(partial, final)
    except BaseException:
        if _fs.exists(partial):
            _fs.rmtree(partial)
        raise
    return manifest


def _shards(prefix: Any) -> int:
    n = min(MAX_SHARDS, os.cpu_count() or 1)
    count = int(prefix.cardinality())
    return max(1, min(n, count) if count > 0 else n)


def _listing(root: str) -> dict[str, int]:
    """Every file under `root`, by path relative to it, with its size."""
    out = {}
    for folder, _, names in tf.io.gfile.walk(root):
        for name in names:
            full = join(folder, name)
            out[full[len(root) :].lstrip("/")] = _fs.size(full)
    return out


def _sweep(directory: str) -> None:
    """Removes sets left half-written by processes that no longer run."""
    for name in _fs.listdir(directory):
        if not name.startswith(_PARTIAL):
            continue
        try:
            pid = int(name.rsplit("-", 2)[-2])
        except ValueError:
            continue
        if _pids.alive(pid):
            continue
        with contextlib.suppress(OSError):  # another process's sweep won
            _fs.rmtree(join(directory, name))


def read(path: str, manifest: dict[str, Any]) -> Any:
    """The set read back: the shards interleaved in the rotation they were
    dealt in (the original order), in parallel; the index dropped."""
    shards = int(manifest["shards"])

    def reader(datasets: Any) -> Any:
        return datasets.interleave(
            lambda d: d,
            cycle_length=shards,
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    loaded = tf.data.Dataset.load(join(path, "data"), reader_func=reader)
    return loaded.map(lambda _, element: element)
