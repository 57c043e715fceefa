"""What the process where `fit` trains holds beside a probe's step, on a CPU.

`memory_limit` on a CPU is the resident memory of the process where `fit`
trains: your data, the libraries, and what Keras's `fit` builds from the
input (on TensorFlow, arrays become a dataset holding a copy of them; a
pipeline's shuffle and prefetch buffers fill). A probe in a fresh child holds
none of that. `measure` reads it in this process, where it is: the resident
memory now, and what Keras's own data path for this input adds while it
yields batches (at two batch sizes: a fixed part and a part per sample). The
probes then count it (`HostShare.offset`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kerascale._units import format_bytes
from kerascale.sense import backend as backend_lib
from kerascale.sense import memory

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts

logger = logging.getLogger("kerascale")

# Builds the input's pipeline at a batch; reads (and holds) some of it.
Setup = Callable[[int], Any]
Read = Callable[[Any, int], Any]

# How much more a process may hold than the one a cached answer was searched
# in and still take it: 2% of memory_limit (a second search in one process
# found 15 MB more resident), at least this much.
MIN_SLACK = 32 << 20


def slack(memory_limit: int | None) -> int:
    return max(MIN_SLACK, (memory_limit or 0) // 50)


# Batches read from the input's pipeline while it is measured: enough for
# its buffers (prefetch, a shuffle's) to fill as they do while training.
BATCHES_READ = 4


@dataclasses.dataclass(frozen=True)
class HostShare:
    """The part of the process where `fit` trains that a probe child lacks.

    Attributes:
        resident: This process's resident memory, where `memory_limit`
            counts it (0 where the limit is a share of the memory available
            now, which this process's memory is already out of).
        input_fixed: What Keras's `fit` builds from the input beside its
            batches (a copy of arrays on TensorFlow), in bytes.
        input_per_sample: What each sample of a global batch adds to it
            (the batches held in its buffers), in bytes.
        why: How it was found, for the result's reasons.
        child_arrays: Samples of synthetic arrays a probe child holds and
            trains through Keras's own `fit(x, y, batch_size=...)`, as this
            process's `fit` trains its arrays (0: a batch repeated). The
            child then holds what this process's `fit` builds from them, so
            only the resident memory differs.
        state_copy: The host copy of the model's and optimizer's variables
            that a `FaultTolerantBackup` holds while it writes a save behind
            training, in bytes (0: none).
    """

    resident: int = 0
    input_fixed: int = 0
    input_per_sample: float = 0.0
    why: str = ""
    child_arrays: int = 0
    state_copy: int = 0

    @classmethod
    def from_list(cls, saved: Sequence[Any]) -> HostShare:
        resident, fixed, per_sample, why, *rest = saved
        arrays = int(rest[0]) if rest else 0
        copy = int(rest[1]) if len(rest) > 1 else 0
        return cls(int(resident), int(fixed), float(per_sample), str(why), arrays, copy)

    def held_bytes(self, global_batch: int) -> int:
        """What this process holds beside a step at `global_batch` that a
        probe lacks: what Keras's fit builds from the input, and the host
        copy of a checkpoint being written behind training."""
        return int(
            self.input_fixed + self.input_per_sample * global_batch + self.state_copy
        )

    @property
    def measured(self) -> bool:
        return bool(self.why)

    @property
    def threshold_fixed(self) -> bool:
        """Whether this process's resident memory counts and glibc's mmap
        threshold is fixed in it (`measure`): its probes then run with it
        fixed too, and the search's reason says so."""
        return bool(self.resident) and memory.mmap_threshold_fixed()

    def offset(self, global_batch: int, child_base: int) -> int:
        """Bytes to add to a child's resident memory (`child_base` before
        its first batch) for the process where `fit` trains; 0 where
        nothing was measured (a GPU's memory, a probe of its own)."""
        if not self.measured:
            return 0
        return self.resident + self.held_bytes(global_batch) - child_base

    def covered_by(
        self, saved: Sequence[Any] | None, global_batch: int, slack: int
    ) -> bool:
        """Whether an answer searched with `saved` (a `to_list()`) holding
        beside its step holds here: this process holds no more than `slack`
        bytes beyond it at `global_batch`."""
        if not saved:
            return not self.measured
        before = HostShare.from_list(saved)
        now = self.resident + self.held_bytes(global_batch)
        then = before.resident + before.held_bytes(global_batch)
        return now <= then + slack

    def to_list(self) -> list[Any]:
        return [
            self.resident,
            self.input_fixed,
            self.input_per_sample,
            self.why,
            self.child_arrays,
            self.state_copy,
        ]


def for_search(
    x: Any,
    y: Any,
    data: DataFacts,
    plan: Plan,
    *,
    memory_limit: int | None,
    on_host: bool,
    start: int,
    cap: int,
    measured: Sequence[Any] = (),
    state_copy: int = 0,
) -> HostShare:
    """The share a batch search (either engine) counts: `measure` at a
    start batch per replica and 4x it (at most `cap`), where the host's
    memory is the budget (`on_host`: a CPU); none elsewhere. `measured`: the
    share an earlier search of the same decision measured (a `to_list()`),
    taken as it is (`SearchRequest.host_share` says why). `state_copy`: the
    bytes of a checkpoint's host copy, held beside the steps."""
    if not on_host:
        return HostShare()
    if measured:
        return HostShare.from_list(measured)
    small = max(1, min(cap, start))
    large = max(1, min(cap, 4 * small))
    share = measure(
        x,
        y,
        data,
        plan,
        counts_resident=bool(memory_limit),
        batches=(small * plan.replicas, large * plan.replicas),
    )
    if not state_copy:
        return share
    copy = f"a checkpoint's {format_bytes(state_copy)} host copy"
    why = f"{share.why}, and {copy}" if share.why else copy
    return dataclasses.replace(share, state_copy=state_copy, why=why)


def measure(
    x: Any,
    y: Any,
    data: DataFacts,
    plan: Plan,
    *,
    counts_resident: bool,
    batches: tuple[int, int],
    shuffle: Any = True,
) -> HostShare:
    """This process's share (see the module doc) for training `x`/`y` (the
    data as `fit` gets it, `data` its facts) under `plan`.

    Args:
        counts_resident: Whether the limit counts this process's memory now
            (`memory_limit` given).
        batches: Two global batch sizes to read the input at.
        shuffle: `fit`'s `shuffle` for arrays.
    """
    if counts_resident:
        # The probes run with it fixed too (child.py): the process where fit
        # trains then reaches a probe's peak, not more.
        memory.fix_mmap_threshold()
    memory.release_freed()
    resident = (memory.resident_bytes() or 0) if counts_resident else 0
    copies = backend_lib.traits(plan.backend).feeds_datasets
    if data.kind == "arrays" and copies and data.measurable:
        return _tensorflow_copy(x, y, resident)
    reader = _reader(x, y, data, plan, shuffle)
    if reader is None:
        why = f"this process's {format_bytes(resident)} resident" if resident else ""
        return HostShare(resident, why=why)
    small, large = sorted(batches)
    if small == large:
        small = max(1, large // 4)
    try:
        at_small, at_large = _added(*reader, small), _added(*reader, large)
    except Exception as e:  # Keras's own fit will say what is wrong
        logger.debug("The input's memory was not measured: %s", e)
        why = f"this process's {format_bytes(resident)} resident" if resident else ""
        return HostShare(resident, why=why)
    per_sample = max(0.0, (at_large - at_small) / max(1, large - small))
    fixed = max(0, int(at_small - per_sample * small))
    why = (
        f"{_held(resident)}what Keras's fit builds from the input: "
        f"{format_bytes(fixed)} + {format_bytes(per_sample)} "
        "per sample, measured here"
    )
    return HostShare(resident, fixed, per_sample, why)


def _held(resident: int) -> str:
    """The resident memory counted, as a reason's start ("" when not)."""
    return f"this process's {format_bytes(resident)} resident, and " if resident else ""


# Keras's TensorFlow fit copies arrays into one tensor (their size), and its
# pipeline's buffers hold batches of it: an MLP's 49 MiB of arrays took 74.6
# MiB more in fit's process than in a probe's at batch 1808 (5.4 MiB a
# batch), 58.7 MiB at batches of 64 and 256 (2 cores, TF 2.21). Assumed only
# where the arrays are too large to copy into a probe child.
TF_BATCHES_HELD = 5

# Arrays up to this size are held in a probe child as synthetic arrays of the
# same shapes, and trained there through Keras's own fit as here: what fit
# builds from them is then measured, not assumed. (An MLP's 16,384 samples:
# the child's peak over its resident memory matched the user's process
# within a run's noise, 184 against 184 MB at batch 2048, where a batch
# repeated in the child, with the copies above assumed, counted 46 KB a
# sample for the user's 26 and answered 0.6 of the truth.) The child's own
# peak stays under the limit either way: it is watched as this process.
CHILD_ARRAYS_MAX = 1 << 30


def _tensorflow_copy(x: Any, y: Any, resident: int) -> HostShare:
    """The share for arrays on TensorFlow: where they are small enough to
    hold in a probe child, the child trains synthetic arrays of their shapes
    through fit as here; else their size and `TF_BATCHES_HELD` batches
    (reading them as fit does would leave its copy here: TensorFlow kept the
    53 MB a conversion of an MLP's arrays took)."""
    import keras
    import numpy as np

    leaves = [a for a in keras.tree.flatten((x, y)) if hasattr(a, "shape")]
    size = sum(int(np.asarray(a).nbytes) for a in leaves)
    samples = max(1, len(leaves[0])) if leaves else 1
    if y is not None and size <= CHILD_ARRAYS_MAX:
        why = (
            f"{_held(resident)}what Keras's fit builds from "
            f"{format_bytes(size)} of arrays, measured in the "
            "probes on arrays of their shapes"
        )
        return HostShare(resident, why=why, child_arrays=samples)
    per_sample = TF_BATCHES_HELD * size / samples
    why = (
        f"{_held(resident)}the copy Keras's fit makes of the arrays: "
        f"{format_bytes(size)} + {TF_BATCHES_HELD} "
        "batches held"
    )
    return HostShare(resident, size, per_sample, why)


def _added(setup: Setup, read: Read, batch: int) -> int:
    """The resident memory the input's pipeline holds while `BATCHES_READ`
    batches of it at `batch` are read and held, beyond what `setup` (not
    counted: what the process holds already) built. What it holds steadily,
    not its momentary peak: a conversion's transient copy is gone before a
    step's memory is taken (measured: a conv net's fit peaked at the data's
    copy plus the step, not at the conversion's two copies plus the step)."""
    built = setup(batch)
    memory.release_freed()
    before = memory.resident_bytes() or 0
    held = read(built, batch)
    memory.release_freed()
    steady = memory.resident_bytes() or 0
    del held, built
    memory.release_freed()
    return max(0, steady - before)


def _reader(
    x: Any, y: Any, data: DataFacts, plan: Plan, shuffle: Any
) -> tuple[Setup, Read] | None:
    """(setup, read) that build the input's pipeline at a batch as Keras's
    `fit` does and read it; None where kerascale cannot read the input
    without consuming it (a generator, a grain loader) or has no arrays."""
    from kerascale import _keras_compat as keras_compat

    if data.kind == "arrays" and data.measurable:
        # Keras builds its pipeline of arrays (a copy, on TensorFlow) in fit.
        def read_arrays(_: Any, batch: int) -> Any:
            return keras_compat.read_like_fit(
                x, y, batch, shuffle, plan.backend, BATCHES_READ
            )

        return (lambda batch: None), read_arrays
    if data.kind == "dataset":
        from kerascale.apply import data as data_lib
        from kerascale.sense.data_facts import peekable

        def setup(batch: int) -> Any:
            # A copy with shuffles of its own (the user's order is left as
            # it is), and with it a copy of what the pipeline holds in
            # memory: built before the reading is measured, which the
            # user's process holds once already.
            planned = dataclasses.replace(
                plan, micro_batch_size=max(1, batch // max(1, plan.replicas))
            )
            optimize = plan.data_changes.optimized
            return data_lib.prepare(
                peekable(x), data, planned, optimize=optimize, read_in_part=True
            )

        def read_dataset(ds: Any, _: int) -> Any:
            # Its buffers fill as they do in training; the step holds one
            # batch, and the next is on its way.
            iterator = iter(ds.take(BATCHES_READ))
            return iterator, collections.deque(iterator, maxlen=2)

        return setup, read_dataset
    return None
