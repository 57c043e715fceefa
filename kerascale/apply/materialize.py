"""Materialized input: the deterministic part of a `tf.data` pipeline run
once, kept on disk as shards, and read back in parallel every epoch after.

A decode that runs again every epoch (JPEG, CSV, parsing, a resize) is the
input-bound job's usual cost, and `prefetch` or a parallel map only spreads
it over the cores. `materialize(ds, directory)` splits the pipeline where
tf.data shows its structure: the longest chain of steps from the source
that are the same every epoch (no shuffle, no random op, no Python code)
is written once; the steps after it (the random part: shuffle,
augmentation, batch) are applied again on what is read back. Where
kerascale cannot tell (Python code, a first step that shuffles, a step it
cannot apply again), it asks for the split: `materialize(deterministic,
directory, then=lambda ds: ...)`.

The format is TensorFlow's own `tf.data.Dataset.save` (the snapshot
format), not TFRecord: it keeps the element structure (nested, ragged,
any dtype) without a parsing spec the user writes, records the element
count, and `Dataset.load` reads its shards through a reader function.
Elements are dealt round-robin to one shard per core (at most 16), and
read back by an interleave over the shards in the same rotation, in
parallel: the order the pipeline gave, exactly.

A set is written under a temporary name; its manifest (the fingerprint,
the element count and spec, every file's size) is written last, and the
set is renamed into place after it. A later run trusts a set only when its
manifest matches the pipeline's fingerprint and every file its size: a set
cut short by a kill has no manifest under the trusted name, and a stale one
(the pipeline or the files it reads changed) has another fingerprint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from kerascale import _fs, _validation
from kerascale import _tf_compat as tfc
from kerascale._tf import tf
from kerascale._units import format_bytes
from kerascale.errors import ConfigurationError
from kerascale.sense import data_facts

logger = logging.getLogger("kerascale")

MANIFEST = "manifest.json"
FORMAT = 1  # the manifest's version
MAX_SHARDS = 16
_PARTIAL = ".partial-"
# Steps kept out of the materialized part even when deterministic: they
# shape what trains (the batch) or only schedule reading, and are applied
# again after reading.
_AFTER = (
    "_BatchDataset",
    "_ParallelBatchDataset",
    "_PrefetchDataset",
    "_OptionsDataset",
    "_RepeatDataset",
)
# A chain starting with one of these reads files; its first argument lists them.
_GLOB = set("*?[")


@dataclasses.dataclass(frozen=True)
class Materialized:
    """What `materialize` did.

    Attributes:
        dataset: What to train on: the shards, read back, then the rest.
        path: The shard set's folder.
        reused: Whether an existing set was verified and read.
        elements: Elements in the set.
        bytes: Bytes on disk.
        seconds: Time spent writing (0 when reused).
        deterministic: The materialized steps, first to last.
        then: The steps applied after reading, first to last (or "then=").
    """

    dataset: Any
    path: str
    reused: bool
    elements: int
    bytes: int
    seconds: float
    deterministic: tuple[str, ...]
    then: tuple[str, ...]

    def describe(self) -> str:
        steps = " -> ".join(self.deterministic) or "the dataset"
        after = " -> ".join(self.then) or "nothing"
        how = (
            "reused (fingerprint and sizes verified)"
            if self.reused
            else f"written in {self.seconds:.1f}s"
        )
        per = self.bytes / max(1, self.elements)
        return (
            f"materialized {steps} to {self.path}: {self.elements} elements, "
            f"{format_bytes(self.bytes)} ({format_bytes(per)} each), {how}; "
            f"applied after reading: {after}"
        )


def materialize(
    ds: Any,
    directory: Any,
    *,
    then: Callable[[Any], Any] | None = None,
    verbose: Any = "auto",
) -> Any:
    """Runs the deterministic part of `ds` once, keeps it in `directory`,
    and returns a dataset that reads it back in parallel and applies the
    rest; `materialized(...).describe()` says what was done.

    Args:
        ds: A `tf.data.Dataset`. Without `then`, kerascale splits it: the
            longest deterministic chain from the source is written, the
            steps after it are applied again on reading. With `then`, `ds`
            is the part to write, on your word (kerascale cannot see
            whether Python code is deterministic).
        directory: A folder (local, or a `gs://` path): one set per
            pipeline fingerprint is kept under it.
        then: A function from the read-back dataset to what trains
            (`lambda ds: ds.shuffle(1000).map(augment).batch(64)`), for
            the random part. Defaults to `None`: the split kerascale finds.
        verbose: 0 says nothing; else one line of what was done. Defaults
            to "auto".

    Returns:
        The `tf.data.Dataset` to train on.

    Raises:
        ConfigurationError: For invalid arguments, or a pipeline whose
            deterministic part kerascale cannot tell (the message says
            how to pass the split).

    Example:

    >>> files = tf.data.Dataset.list_files("images/*.jpg", shuffle=False)
    >>> ds = files.map(decode).shuffle(1000).map(augment).batch(64)
    >>> ds = kerascale.data.materialize(ds, "/data/cache")  # decode once
    """
    done = materialized(ds, directory, then=then)
    if verbose != 0:
        print(f"kerascale: {done.describe()}", flush=True)
    return done.dataset


def materialized(
    ds: Any, directory: Any, *, then: Any = None, write: bool = True
) -> Materialized:
    """`materialize`'s work, with its record (`Materialized`). Without
    `write` (`kerascale.plan`), nothing is written or removed: the record
    says whether a trusted set is there, and its dataset is `ds`."""
    directory = _checked(ds, directory, then)
    prefix, tail = split(ds, then)
    key = fingerprint(prefix)
    path = _fs_join(directory, key)
    if not write:
        found = _trusted(path, key, prefix, discard=False)
        return Materialized(
            dataset=ds, path=path, reused=found is not None,
            elements=int(found["elements"]) if found else 0,
            bytes=sum(found["files"].values()) if found else 0, seconds=0.0,
            deterministic=_steps(prefix), then=_after(tail, then),
        )  # fmt: skip
    manifest = _trusted(path, key, prefix)
    start = time.perf_counter()
    reused = manifest is not None
    if manifest is None:
        manifest = _write(prefix, directory, key)
    seconds = 0.0 if reused else time.perf_counter() - start
    out = _read(path, manifest)
    if then is not None:
        out = then(out)
    for node in reversed(tail):
        out = tfc.replay(node, out)
    return Materialized(
        dataset=out,
        path=path,
        reused=reused,
        elements=int(manifest["elements"]),
        bytes=sum(manifest["files"].values()),
        seconds=seconds,
        deterministic=_steps(prefix),
        then=_after(tail, then),
    )


def _steps(prefix: Any) -> tuple[str, ...]:
    return tuple(_step(n) for n in reversed(data_facts.chain(prefix)))


def _after(tail: list[Any], then: Any) -> tuple[str, ...]:
    return ("then=",) if then is not None else tuple(_step(n) for n in reversed(tail))


def decode_share(
    ds: Any, elements_per_s: float, elements: int = 256
) -> tuple[float, str] | None:
    """(the share of the pipeline's time per element that its deterministic
    part takes, measured here; that part's steps), for `diagnose`: the part
    alone is read for up to `elements` elements (after one), against the
    whole pipeline's `elements_per_s`. None where there is no split, or the
    part batches (its elements are not the pipeline's)."""
    try:
        prefix, _ = split(ds)
    except ConfigurationError:
        return None
    if any(tfc.static_batch_size(n) for n in data_facts.chain(prefix)):
        return None
    count = int(prefix.cardinality())
    n = min(elements, count) if count > 0 else elements
    it = iter(data_facts.peekable(prefix).take(n))
    next(it, None)  # the first element: start-up, not the rate
    start, read = time.perf_counter(), 0
    for _ in it:
        read += 1
    seconds = time.perf_counter() - start
    if read < 8 or seconds <= 0:
        return None
    share = min(1.0, elements_per_s / (read / seconds))
    return share, " -> ".join(_steps(prefix))


def for_fit(x: Any, directory: Any, *, write: bool) -> tuple[Any, str, str]:
    """`fit(materialize=directory)`: (what trains, the plan's note, a
    warning). What cannot be materialized trains as given, with the warning
    saying why and how to get it."""
    if directory is None:
        return x, "", ""
    if not data_facts.is_dataset(x):
        return (
            x,
            "",
            (
                f"materialize={os.fspath(directory)!r} was not applied: it writes a "
                f"tf.data.Dataset's deterministic part, and x is a {type(x).__name__} "
                "(trained as given)"
            ),
        )
    try:
        done = materialized(x, directory, write=write)
    except Exception as e:  # kerascale's own addition: dropped, said once
        return (
            x,
            "",
            (
                f"materialize={os.fspath(directory)!r} was not applied "
                f"({type(e).__name__}: {e}); trained on the pipeline as given. "
                "kerascale.data.materialize(ds, directory, then=...) takes the split "
                "yourself"
            ),
        )
    if write:
        return done.dataset, done.describe(), ""
    state = "reused" if done.reused else "written when fit runs"
    steps = " -> ".join(done.deterministic)
    return x, f"materialized {steps} to {done.path} ({state})", ""


def _checked(ds: Any, directory: Any, then: Any) -> str:
    if not data_facts.is_dataset(ds):
        raise _validation.fail("ds", type(ds).__name__, "a tf.data.Dataset")
    if not isinstance(directory, str | os.PathLike) or not str(directory):
        raise _validation.fail("directory", directory, "a folder path")
    if then is not None and not callable(then):
        raise _validation.fail(
            "then", then, "None or a function from a dataset to a dataset"
        )
    return os.fspath(directory)


def split(ds: Any, then: Any = None) -> tuple[Any, list[Any]]:
    """(the part to write, the steps after it, last first).

    Raises:
        ConfigurationError: Where kerascale cannot tell the split, or the
            part to write (given with `then`) draws random seeds.
    """
    if then is not None:
        if tfc.draws_seeds(ds):
            raise ConfigurationError(
                "materialize(ds, then=...) writes ds once, so ds must be the same "
                "every epoch, and it shuffles (or draws from Dataset.random): "
                "move the shuffle into then=. Received: ds with a shuffle"
            )
        return ds, []
    nodes = data_facts.chain(ds)
    for i, node in enumerate(nodes):
        if type(node).__name__ in _AFTER:
            continue
        if tfc.draws_seeds(node) or data_facts.stateful_reason(node):
            continue
        tail = nodes[:i]
        for step in tail:
            if not _replayable(step):
                raise _ask(f"the step {_step(step)} cannot be applied again")
        if not any("Map" in type(n).__name__ for n in data_facts.chain(node)):
            random = _first_random(ds)
            raise _ask(f"no map comes before its first random step ({random})")
        if int(node.cardinality()) == tf.data.INFINITE_CARDINALITY:
            raise _ask(f"its deterministic part, {_step(node)}, never ends")
        return node, tail
    raise _ask(f"no part of it is the same every epoch ({_first_random(ds)})")


def _replayable(node: Any) -> bool:
    return type(node).__name__ in (
        "_MapDataset",
        "_ParallelMapDataset",
        "_FilterDataset",
        "_ShuffleDataset",
        *_AFTER,
    )


def _first_random(ds: Any) -> str:
    """The first step from the source that is random or Python code."""
    for node in reversed(data_facts.chain(ds)):
        if tfc.draws_seeds(node):
            source = tfc.dataset_input(node)
            names = source is not None and tfc.dataset_input(source) is None
            spec = source.element_spec if names else None
            hint = (
                " (Dataset.list_files shuffles unless shuffle=False)"
                if isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string
                else ""
            )
            return f"{_step(node)} shuffles{hint}"
        reason = data_facts.stateful_reason(node)
        if reason:
            return f"{_step(node)}: {reason}"
    return "a step kerascale cannot see into"


def _ask(why: str) -> ConfigurationError:
    return ConfigurationError(
        f"materialize cannot tell which part of this pipeline is the same every "
        f"epoch: {why}. Pass the split yourself: materialize(deterministic, "
        f"directory, then=lambda ds: <the rest>), where deterministic is your "
        f"pipeline up to its last step that gives the same elements every epoch "
        f"(decoding, parsing, resizing), and then= applies the rest (shuffle, "
        f"random augmentation, batch) on what is read back."
    )


def _step(node: Any) -> str:
    return type(node).__name__.strip("_").removesuffix("Dataset") or "Dataset"


def fingerprint(ds: Any) -> str:
    """What identifies the part written: its steps and their functions'
    graphs, its element spec and length (`data_facts.signature`), every
    constant it holds (file names, in-memory tensors), and the size and
    modification time of each file those name (globs expanded)."""
    h = hashlib.sha256(data_facts.signature(ds).encode())
    for value in _constants(ds):
        h.update(value)
    for path in _files(ds):
        try:
            stat = os.stat(path)
            h.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        except OSError:
            h.update(f"{path}:missing".encode())
    return h.hexdigest()[:20]


def _constants(ds: Any) -> list[bytes]:
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    policy = tf.data.experimental.ExternalStatePolicy.WARN
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    return [
        node.attr["value"].tensor.SerializeToString()
        for node in graph.node
        if node.op == "Const" and "value" in node.attr
    ]


def _files(ds: Any) -> list[str]:
    """Local files the pipeline's string constants name, globs expanded."""
    from tensorflow.core.framework import tensor_pb2, types_pb2

    names = set()
    for raw in _constants(ds):
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


def _fs_join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def _trusted(
    path: str, key: str, prefix: Any, *, discard: bool = True
) -> dict[str, Any] | None:
    """The manifest of the set at `path`, where it can be trusted: written
    in full for this fingerprint and element spec, every file its size.
    A set that fails the check is removed (it would never be read), with
    `discard`."""
    manifest_path = _fs_join(path, MANIFEST)
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
        file = _fs_join(path, name)
        if not _fs.exists(file) or _fs.size(file) != size:
            return f"{name} is missing or not the size it was written at"
    return ""


def _discard(path: str, why: str) -> None:
    logger.warning("kerascale: not reading the shard set %s: %s", path, why)
    try:
        _fs.rmtree(path)
    except OSError as e:
        logger.warning("kerascale: could not remove %s (%s)", path, e)


def _write(prefix: Any, directory: str, key: str) -> dict[str, Any]:
    """Writes the set under a temporary name, then its manifest, then
    renames it into place; returns the manifest. Sets others left
    half-written by processes that are gone are removed first."""
    _fs.makedirs(directory)
    _sweep(directory)
    name = f"{_PARTIAL}{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    partial = _fs_join(directory, name)
    shards = _shards(prefix)
    data = _fs_join(partial, "data")
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
        with _fs.open_file(_fs_join(partial, MANIFEST), "wb") as f:
            f.write(json.dumps(manifest, indent=1).encode())
        final = _fs_join(directory, key)
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
            full = _fs_join(folder, name)
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
        if _alive(pid):
            continue
        with contextlib.suppress(OSError):  # another process's sweep won
            _fs.rmtree(_fs_join(directory, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: str, manifest: dict[str, Any]) -> Any:
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

    loaded = tf.data.Dataset.load(_fs_join(path, "data"), reader_func=reader)
    return loaded.map(lambda _, element: element)
