"""Materialized input: the deterministic part of a `tf.data` pipeline run
once, kept on disk as shards, and read back in parallel every epoch after.

Its design: docs/design/modules.md, `kerascale.apply.materialize`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kerascale import _tf_compat as tfc
from kerascale import _validation
from kerascale._display import said
from kerascale._tf import tf
from kerascale._units import format_bytes
from kerascale.apply import shard_files
from kerascale.errors import ConfigurationError
from kerascale.sense import data_facts

logger = logging.getLogger("kerascale")

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
        print(said(f"kerascale: {done.describe()}"), flush=True)
    return done.dataset


def materialized(
    ds: Any, directory: Any, *, then: Any = None, write: bool = True
) -> Materialized:
    """`materialize`'s work, with its record (`Materialized`). Without
    `write` (`kerascale.plan`), nothing is written or removed: the record
    says whether a trusted set is there, and its dataset is `ds`."""
    directory = _checked(ds, directory, then)
    prefix, tail = split(ds, then)
    key = shard_files.fingerprint(prefix)
    path = shard_files.join(directory, key)
    if not write:
        found = shard_files.trusted(path, key, prefix, discard=False)
        return Materialized(
            dataset=ds,
            path=path,
            reused=found is not None,
            elements=int(found["elements"]) if found else 0,
            bytes=sum(found["files"].values()) if found else 0,
            seconds=0.0,
            deterministic=_steps(prefix),
            then=_after(tail, then),
        )
    manifest = shard_files.trusted(path, key, prefix)
    start = time.perf_counter()
    reused = manifest is not None
    if manifest is None:
        manifest = shard_files.write(prefix, directory, key)
    seconds = 0.0 if reused else time.perf_counter() - start
    out = shard_files.read(path, manifest)
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


def materialized_input(x: Any, directory: Any, *, write: bool) -> tuple[Any, str, str]:
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
