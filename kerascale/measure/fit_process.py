"""A probe's peak counted as the process where `fit` trains would reach it
(the batch search on a CPU, under a resident-memory limit)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerascale.measure.host_share import HostShare

# Kept below memory_limit by the probes where they count the process where
# fit trains (at least; 1% of the limit where that is more).
PROBE_SLACK = 8 << 20

# A probe trains for seconds; a user's run of arrays on TensorFlow for many
# epochs, and its peak moves from run to run as the allocator's heap does:
# one script, an MLP at batch 9728 for 20 epochs, peaked 1326, 1423, 1364
# and 1421 MiB over 812 MiB resident (a spread of about a fifth of what fit
# added), where one epoch peaked 1293. A probe of arrays counts its growth
# (its peak over its baseline) this much larger, so that the answer fits
# such a run, not only a probe's.
LONG_RUN_SPREAD = 0.2

# TensorFlow's executor on a CPU orders a step's ops as its threads come
# free, so the buffers live at its peak depend on the machine's load: an MLP
# of one 16384-wide layer, 2 steps at batch 3968, peaked 1285 MiB on an idle
# machine and 1530 with two other processes busy (bimodal over runs; the
# difference is one of its 248 MiB activations). A probe runs on whatever
# load there is, so each counts one more of the model's largest layer
# outputs at its batch (or the long run's spread, where that is more).


def op_order_bytes(model: Any, policy: str) -> int:
    """The bytes one sample puts in the model's largest layer output, at the
    width of `policy`'s compute dtype (mixed_bfloat16's outputs are bf16):
    what another order of a step's ops holds, per sample."""
    import keras

    from kerascale._units import dtype_bytes
    from kerascale.sense.model_facts import largest_output_elements

    width = dtype_bytes(keras.DTypePolicy(policy).compute_dtype)
    return largest_output_elements(model) * width


def with_slack(limit: int) -> int:
    """`limit` less what is kept below it. Counted as the process where fit
    trains, a peak is a sum of figures from two processes, a few MB apart (an
    MLP's answer went 3.9 MiB over 1 GiB without this). More would cost much
    where memory barely grows with the batch (that MLP's, 0.04 MiB a sample:
    a 32 MiB slack cut its batch to 48)."""
    return limit - max(PROBE_SLACK, limit // 100)


@dataclasses.dataclass(frozen=True)
class AsFitProcess:
    """A probe's peak as the process where fit trains would reach it: its
    own memory and its input's in place of this child's (`share`, `sample`
    bytes of a repeated batch held twice here), and what a probe of seconds
    does not see (`spread` of its growth, `op_order` bytes a sample)."""

    base: int
    share: HostShare
    sample: int
    spread: float
    op_order: int

    def offset(self, global_batch: int) -> int:
        return self.share.offset(global_batch, self.base) - (
            2 * self.sample * global_batch
        )

    def peak(self, child_peak: int, global_batch: int) -> int:
        grown = max(0, child_peak - self.base)
        unseen = max(int(self.spread * grown), self.op_order * global_batch)
        return child_peak + self.offset(global_batch) + unseen

    def watched(self, limit: int, global_batch: int) -> int:
        """The child's resident memory at which `peak` passes `limit`."""
        offset = self.offset(global_batch)
        return int(
            min(
                (limit - offset + self.spread * self.base) / (1 + self.spread),
                limit - offset - self.op_order * global_batch,
            )
        )
