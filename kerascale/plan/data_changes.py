"""What kerascale changes in the input pipeline: a plan's `data_changes`,
as fields that code reads and words that people read."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

# The words of each change, in the order the plan shows them.
MATERIALIZED = "materialized"
PARALLEL_MAP = "map parallelization"
PREFETCH = "prefetch(AUTOTUNE)"
CACHE = "cache()"
SHARD = {
    "data": "shard by data",
    "file": "shard by file (by data if fewer files than workers)",
}
READ_AHEAD = "read ahead on a thread"  # where a callback waits on each step
BY_PROCESS = "each process reads its block of every global batch"
CUT_AS_READ = "each batch cut to a multiple of the devices as it is read"
AUTOTUNE_OFF = "autotuning off (parallel calls at the cores, up to 16)"


@dataclasses.dataclass(frozen=True)
class DataChanges:
    """What kerascale changes in the input pipeline (nothing by default).

    Attributes:
        materialized: Trained on a materialized copy of the input
            (`kerascale.data.materialize`), set by `fit`.
        batch: An unbatched `tf.data` input is batched at this global size.
        rebatch_from: A batched `tf.data` input's own batch, re-batched to
            `batch`.
        parallel_map: A `map` that ran one element at a time runs in parallel.
        prefetch: `prefetch(AUTOTUNE)` added.
        cache: `cache()` added (the input fits in memory).
        shard: How several replicas' workers share the input: "data",
            "file", or "" where they do not.
        read_ahead: On JAX, batches are read ahead on a thread
            (`kerascale.callbacks.Prefetch`), where a callback waits on
            each step.
        by_process: On JAX, each process reads its block of every global
            batch.
        left_out: On JAX, samples left out at each epoch's end, where the
            devices cannot split the last batch.
        cut_as_read: On JAX, each batch is cut to a multiple of the devices
            as it is read.
        autotune_off: tf.data's autotuning is off on a `tf.data` input
            kerascale prepares (`options.autotune.enabled=False`): its
            parallel calls run at the number of cores (up to 16, tf.data's
            starting parallelism), its prefetch buffer grows as it runs dry,
            and dropping an iterator does not wait on the autotuning thread
            (`apply.data.prepare`).
    """

    materialized: bool = False
    batch: int | None = None
    rebatch_from: int | None = None
    parallel_map: bool = False
    prefetch: bool = False
    cache: bool = False
    shard: str = ""
    read_ahead: bool = False
    by_process: bool = False
    left_out: int = 0
    cut_as_read: bool = False
    autotune_off: bool = False

    def __post_init__(self):
        if self.shard not in ("", *SHARD):
            raise ValueError(f"shard must be '', 'data' or 'file'; got {self.shard!r}")
        if self.rebatch_from is not None and self.batch is None:
            raise ValueError("rebatch_from needs the batch it rebatches to")

    @property
    def optimized(self) -> bool:
        """Whether `optimize_data` changed anything (batching, the JAX
        split and materializing aside)."""
        return (
            self.parallel_map
            or self.prefetch
            or self.cache
            or bool(self.shard)
            or self.read_ahead
            or self.autotune_off
        )

    @property
    def pipeline(self) -> tuple[str, ...]:
        """The words of every change but the batching: what plain
        `model.fit` would not do to the input."""
        return dataclasses.replace(self, batch=None, rebatch_from=None).words()

    def words(self) -> tuple[str, ...]:
        """Each change in words, in the plan's order."""
        out = [MATERIALIZED] if self.materialized else []
        out += self._batching()
        out += [PARALLEL_MAP] if self.parallel_map else []
        out += [PREFETCH] if self.prefetch else []
        out += [AUTOTUNE_OFF] if self.autotune_off else []
        out += [CACHE] if self.cache else []
        out += [SHARD[self.shard]] if self.shard else []
        out += [READ_AHEAD] if self.read_ahead else []
        out += [BY_PROCESS] if self.by_process else []
        if self.left_out:
            out.append(f"last {self.left_out} sample(s) of each epoch left out")
        out += [CUT_AS_READ] if self.cut_as_read else []
        return tuple(out)

    def _batching(self) -> list[str]:
        if self.batch is None:
            return []
        if self.rebatch_from is None:
            return [f"batch({self.batch})"]
        return [f"rebatch({self.rebatch_from} -> {self.batch})"]

    def __str__(self) -> str:
        return ", ".join(self.words()) or "unchanged"

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that differ from no change: JSON-ready."""
        none = DataChanges()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(none, f.name)
        }

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any] | Sequence[str]) -> DataChanges:
        """From `to_dict`'s form; or from the list of words a plan saved in
        a checkpoint before this type existed (kerascale 0.1.0 until
        2026-11-28), read once here so that such a checkpoint still pins its
        choices when resumed. A field this kerascale has no more (a saved
        plan's `one_iterator`, from 2026-12-05's kerascale) is dropped: the
        resumed run decides without it."""
        if isinstance(saved, Mapping):
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in saved.items() if k in known})
        return _from_old_words(list(saved))


def _from_old_words(words: list[str]) -> DataChanges:
    """The changes an older plan listed as words. What no field holds (a
    wording that changed) is dropped: the resumed run then re-decides it."""
    fields: dict[str, Any] = {}
    flags = {
        MATERIALIZED: "materialized",
        PARALLEL_MAP: "parallel_map",
        PREFETCH: "prefetch",
        CACHE: "cache",
        BY_PROCESS: "by_process",
        CUT_AS_READ: "cut_as_read",
    }
    for word in words:
        if word in flags:
            fields[flags[word]] = True
        elif word.startswith("read ahead on a thread"):
            fields["read_ahead"] = True
        elif word.startswith("shard by "):
            fields["shard"] = "file" if word.startswith("shard by file") else "data"
        elif word.startswith("batch(") and word[6:-1].isdigit():
            fields["batch"] = int(word[6:-1])
        elif word.startswith("rebatch(") and " -> " in word:
            before, after = word[8:-1].split(" -> ")
            if before.isdigit() and after.isdigit():
                fields["rebatch_from"], fields["batch"] = int(before), int(after)
    return DataChanges(**fields)
