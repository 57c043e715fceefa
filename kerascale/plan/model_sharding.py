"""Which variables to split, over which mesh, when one replica does not fit a
device (JAX's SPMD: `keras.distribution.ModelParallel`). Pure: the compiles
that decide whether to shard, and over which mesh, are
`measure.jax.replica_fit`'s; carrying it out is `apply.jax.distribution`'s.

Its design: docs/design/modules.md, `kerascale.plan.model_sharding`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from kerascale._units import dtype_bytes, format_bytes
from kerascale.plan.reasons import Reason

BATCH_AXIS = "batch"
MODEL_AXIS = "model"
# Meshes whose measured throughputs are within this fraction are a tie (a
# few steps' timing is that noisy): the smaller model axis is kept.
TIE = 0.05
# Variables smaller than this stay replicated: splitting them saves little
# and costs an exchange per use.
THRESHOLD_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class VariableShape:
    """What the layout rule reads of one variable."""

    path: str
    shape: tuple[int, ...]
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Sharded:
    """Planning's own request (not a user's option) for ModelParallel.

    Attributes:
        mesh: (batch, model) devices.
        layouts: {variable path: its axes' mesh names} (`layouts`).
        why: The figures that decided it, in words.
        replicated: Per-device bytes of one replica, by the compiler.
        sharded: Per-device bytes under `mesh`, by the compiler.
        seconds: {"batch x model": seconds per step} of the meshes timed.
    """

    mesh: tuple[int, int]
    layouts: Mapping[str, tuple[str | None, ...]]
    why: str
    replicated: int = 0
    sharded: int = 0
    seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def as_plan_field(self) -> dict[str, Any]:
        """What `Plan.sharding` holds (JSON-ready)."""
        return {
            "mesh": list(self.mesh),
            "layouts": {path: list(axes) for path, axes in self.layouts.items()},
            "bytes": {"replicated": self.replicated, "sharded": self.sharded},
            "seconds_per_step": dict(self.seconds),
        }


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One mesh tried: its layout and what measuring it found.

    Attributes:
        mesh: (batch, model) devices.
        split: Its layouts (`layouts`, or the model's own).
        whose: Where `split` comes from, in words.
        batch: Samples per step over the whole mesh.
        need: Per-device bytes, by the compiler.
        seconds: One real step's seconds, or None where it was not timed.
        untimed: Why it was not timed ("" where it was).
    """

    mesh: tuple[int, int]
    split: Mapping[str, tuple[str | None, ...]]
    whose: str
    batch: int
    need: int
    seconds: float | None = None
    untimed: str = ""

    @property
    def name(self) -> str:
        return f"{self.mesh[0]} x {self.mesh[1]}"


def choose(
    tried: list[Candidate], usable: int
) -> tuple[Candidate | None, Reason | None]:
    """(the mesh to train on, why): of those whose per-device
    bytes fit `usable`, the one of the highest measured samples per second,
    a tie (`TIE`) going to the smaller model axis; where none was timed, the
    smallest model axis that fits. None where none fits."""
    fitting = [c for c in tried if c.need <= usable]
    if not fitting:
        return None, None
    if len(fitting) == 1:
        return fitting[0], Reason("mesh.only_fit", mesh=fitting[0].name)
    rates = [(c, c.batch / c.seconds) for c in fitting if c.seconds]
    if not rates:
        why = fitting[0].untimed or "not timed"
        return fitting[0], Reason("mesh.untimed", why=why)
    best = max(rate for _, rate in rates)
    chosen, rate = next((c, r) for c, r in rates if r >= best * (1 - TIE))
    tie = TIE if rate < best else 0
    return chosen, Reason("mesh.fastest", mesh=chosen.name, tie=tie, rate=rate)


def describe(tried: list[Candidate], usable: int) -> str:
    """The meshes tried, their bytes per device and step times, in words."""
    parts = []
    for c in tried:
        part = f"{c.name}: {format_bytes(c.need)}"
        if c.need > usable:
            part += " (over)"
        elif c.seconds:
            part += f", {c.seconds * 1e3:.1f} ms per step of {c.batch}"
        parts.append(part)
    return "; ".join(parts)


def timings(tried: list[Candidate]) -> dict[str, float]:
    """{"batch x model": seconds per step} of the meshes timed."""
    return {c.name: c.seconds for c in tried if c.seconds}


def plan_field(strategy: Any) -> dict[str, Any]:
    """`Plan.sharding` for a plan made for `strategy` (empty unless it is
    planning's own `Sharded` request)."""
    return strategy.as_plan_field() if isinstance(strategy, Sharded) else {}


def variable_bytes(variable: Any) -> int:
    """The bytes of a variable (or its gradient) in its own dtype."""
    return math.prod(variable.shape) * dtype_bytes(variable.dtype)


def meshes(devices: int) -> list[tuple[int, int]]:
    """The (batch, model) meshes over `devices` with a model axis of 2 or
    more, the smallest model axis first."""
    return [(devices // k, k) for k in range(2, devices + 1) if devices % k == 0]


def layouts(
    variables: Iterable[VariableShape],
    model_axis: int,
    threshold: int = THRESHOLD_BYTES,
) -> dict[str, tuple[str | None, ...]]:
    """{variable path: its axes' mesh names} for the variables split over a
    model axis of `model_axis` devices: each of at least `threshold` bytes,
    along its largest axis that `model_axis` divides (the last such on a
    tie). A variable with no such axis stays replicated, as do the small."""
    out: dict[str, tuple[str | None, ...]] = {}
    for v in variables:
        if model_axis < 2 or v.nbytes < threshold:
            continue
        fits = [
            i for i, n in enumerate(v.shape) if n >= model_axis and n % model_axis == 0
        ]
        if not fits:
            continue
        axis = max(fits, key=lambda i: (v.shape[i], i))
        out[v.path] = tuple(
            MODEL_AXIS if i == axis else None for i in range(len(v.shape))
        )
    return out


def bytes_per_device(
    variables: Iterable[VariableShape],
    split: Mapping[str, Any],
    model_axis: int,
) -> int:
    """The variables' bytes on one device under `split` (the split ones
    divided over the model axis, the rest whole)."""
    return sum(
        v.nbytes // model_axis if v.path in split else v.nbytes for v in variables
    )
