"""Where a batch search's probes run: the one rule (issue 57).

A probe in a child process can run out of memory under a real limit and
never harm the user's process; one in this process costs no start. So:

1. `isolate=True` or False is obeyed.
2. This process, where a child could not hold to the truth: your strategy
   instance lives here, a TPU serves one process at a time, and on a GPU
   this process's allocator holds the memory training will use (running out
   of it is an error the process survives).
3. This process, where the model cannot be shipped (custom objects that are
   not importable).
4. Else child processes. On a CPU they are forked from one server that
   imported TensorFlow once (`fork_server`): a fresh TensorFlow per probe
   cost 3-4 s each on 2 cores. GPU children start fresh (a GPU's driver must
   not be initialised before a fork).
5. And on a CPU's throughput search with no `memory_limit`, on one device, the
   batches whose steps are far below the memory free run here first
   (`headroom`): a short run's search then starts no TensorFlow at all.

`benchmarks/probe_placement.py` measures each against the others.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kerascale.measure import shipping
from kerascale.plan.reasons import Reason
from kerascale.sense.model_facts import is_builder, output_elements

if TYPE_CHECKING:
    from kerascale.measure.request import SearchOptions
    from kerascale.plan.plan import Plan
    from kerascale.sense.hardware import Hardware

# A batch runs here if SAFETY x its predicted growth is under SHARE x limit.
SAFETY = 2.0
SHARE = 0.25
# The prior, in bytes: each parameter as the clone's weight, its gradient and
# two optimizer slots, float32; each layer output four times (kept for the
# backward pass, its gradient, two temporaries), float32 whatever the policy.
PARAM_BYTES = 16
OUTPUT_BYTES = 16


def prior_for(model: Any) -> tuple[int, int] | None:
    """(fixed, per-sample) bytes a step is predicted to add, from the
    model's shapes; None where they are unknown (a builder, a subclassed
    model without symbolic outputs)."""
    if is_builder(model):
        return None
    elements = output_elements(model)
    try:
        params = model.count_params()
    except ValueError:  # not built
        return None
    return (PARAM_BYTES * params, OUTPUT_BYTES * elements) if elements else None


@dataclasses.dataclass(frozen=True)
class Room:
    """What a search may probe here: the limit it works against, and the
    model's prior (fixed, per-sample bytes)."""

    limit: int
    prior: tuple[int, int]


# The seam benchmarks/probe_placement.py turns off to measure fresh children.
FORK_ON_CPU = True


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a search's probes run, and why.

    Attributes:
        in_children: Whether in child processes.
        why: Why there.
        room: Where probes may run in this process first (below the memory
            limit), or None.
        forked: Whether the children are forked from one server.
    """

    in_children: bool
    why: Reason
    room: Room | None = None
    forked: bool = False

    def here(self, why: Reason | None = None) -> Placement:
        """This placement moved to this process (a child could not load
        the model), with `why` if given."""
        return Placement(False, why or self.why)


def place(
    model: Any,
    hw: Hardware,
    plan: Plan,
    options: SearchOptions,
    instance: Any,
    *,
    mode: str,
    limit: int | None,
) -> Placement:
    """Where `model`'s probes run for a search in `mode` against `limit`
    bytes (the memory model's limit), by the rule above."""
    if options.isolate != "auto":
        asked = Reason("isolate.asked", isolate=options.isolate)
        return _children(hw, asked) if options.isolate else Placement(False, asked)
    if instance is not None:
        return Placement(False, Reason("isolate.your_instance"))
    if hw.accelerator == "tpu":
        return Placement(False, Reason("isolate.tpu"))
    if hw.accelerator == "gpu":
        return Placement(False, Reason("isolate.gpu"))
    if not is_builder(model):
        _, problem = shipping.custom_objects(model)
        if problem:
            return Placement(False, Reason("isolate.cannot_ship", problem=problem))
    children = _children(hw, Reason("isolate.children"))
    if (
        mode == "throughput"
        and not options.memory_limit
        and limit is not None
        and len(plan.devices) <= 1
        and hw.cpu.logical_devices <= 1
    ):
        prior = prior_for(model)
        if prior is not None:
            return dataclasses.replace(children, room=Room(limit, prior))
    return children


def _children(hw: Hardware, why: Reason) -> Placement:
    return Placement(True, why, forked=FORK_ON_CPU and hw.accelerator == "cpu")
