"""The largest batch whose compiled train step fits a device, on JAX: from
XLA's own memory analysis, in few compiles, with no step run.

Its design: docs/design/modules.md, `kerascale.measure.jax.compiled`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import keras

from kerascale._units import format_bytes
from kerascale.errors import BatchSizeSearchError
from kerascale.measure import search as search_lib
from kerascale.measure.result import OK, OOM, ProbeResult
from kerascale.sense.model_facts import gist

# At most this many compiles per search (the bracket is narrowed until then).
MAX_COMPILES = 5
# The bracket is narrow enough when its ends are within this fraction.
TOLERANCE = 0.02
# On a CPU without memory_limit: the share of the memory available now.
# Steps timed per candidate where a step's speed decides (a sharded mesh).
TIMED_STEPS = 3


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One compile's figures.

    Attributes:
        batch: The per-replica batch compiled.
        need_bytes: What the step needs on one device beyond the state held
            there.
        seconds: The lowering and compile's wall time.
        samples_per_s: Real steps' throughput across replicas, where the
            step was also run (`StepMemory.seconds`); else None.
    """

    batch: int
    need_bytes: int
    seconds: float
    samples_per_s: float | None = None

    def as_probe(self, free_bytes: int) -> ProbeResult:
        """This compile as a search reads a probe: whether it fits, and its
        need (known on both sides, so a secant may pass through a failure)."""
        fits = self.need_bytes <= free_bytes
        return ProbeResult(
            batch=self.batch,
            outcome=OK if fits else OOM,
            peak_bytes=self.need_bytes,
            seconds=self.seconds,
            message="" if fits else "over the free memory by XLA's count (not run)",
            samples_per_s=self.samples_per_s,
        )


class StepMemory:
    """Compiles Keras's train step of `model` at a batch and reads what it
    needs on one device, or, with `host`, in the process's memory.

    Args:
        model: The model as it will train (precision set, distribution set,
            variables laid out): the step traces what is there now. Its
            optimizer slots and compiled metrics are built here, as Keras's
            first step builds them.
        element: The per-sample `(x, y)` structure, leaves with `.shape`
            (without the batch) and `.dtype`.
        distribution: The `keras.distribution` the run sets, or None.
        replicas: How many ways the batch is split.
        host: The devices are the CPU's: every replica's buffers share the
            process's memory, and so does what the input pipeline holds on
            the host (Keras's array adapter copies each batch out of your
            arrays), which the compiler does not see.
        held_batches: Batches held beside the step's own, which the
            compiler does not see either: `kerascale.callbacks.Prefetch`'s
            read ahead (laid out on the devices as Keras lays out a batch).
        held_bytes: With `host`, what this process holds beside a step at
            a global batch (the input pipeline's, and a checkpoint's host
            copy), as measured here (`measure.host_share`); else one batch is
            counted.
    """

    def __init__(
        self,
        model: Any,
        element: Any,
        distribution: Any,
        replicas: int,
        *,
        host: bool = False,
        held_batches: int = 0,
        held_bytes: Callable[[int], int] | None = None,
    ):
        import jax

        from kerascale import _keras_compat as keras_compat

        self._jax = jax
        self.element, self.replicas = element, replicas
        self.distribution = distribution
        keras_compat.build_like_first_step(model, _one_sample(element))
        state = keras_compat.train_state(model)
        # Placed as Keras's trainer passes them: with their shardings under a
        # distribution, else as plain values (the same program, so the same
        # cache entry as training's).
        self.state = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(
                a.shape, a.dtype, sharding=a.sharding if distribution else None
            ),
            state,
        )
        self.state_bytes = sum(
            _bytes_on_one_device(a) for a in jax.tree_util.tree_leaves(state)
        )
        shardings = None
        if distribution is not None:
            shardings = (None, jax.tree_util.tree_map(lambda a: a.sharding, state))
        self._step = jax.jit(
            model.train_step, donate_argnums=0, out_shardings=shardings
        )
        self.host, self.held_batches = host, held_batches
        self.held_bytes = held_bytes
        # Gradient accumulation adds one accumulator per trainable variable,
        # in its dtype and layout: held beside the state while training.
        self.accumulator_bytes = sum(
            _bytes_on_one_device(v.value) for v in model.trainable_variables
        )
        self.sample_bytes = sum(
            math.prod(leaf.shape) * jax.numpy.dtype(leaf.dtype).itemsize
            for leaf in keras.tree.flatten(element)
        )

    def need(self, batch: int) -> Compiled:
        """Compiles the step at per-replica `batch`; its figures."""
        start = time.perf_counter()
        data = self._data(batch * self.replicas)
        analysis = self._step.lower(self.state, data).compile().memory_analysis()
        total = (
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes
        )
        need = max(0, total - self.state_bytes)
        # A replica's share of each batch held ahead, on its device.
        need += self.held_batches * self.sample_bytes * batch
        if self.host:  # every replica in this process's memory, and the input
            global_batch = batch * self.replicas
            taken = (
                self.held_bytes(global_batch)
                if self.held_bytes is not None
                else self.sample_bytes * global_batch
            )
            need = need * self.replicas + taken
        found = Compiled(batch, need, time.perf_counter() - start)
        return found

    def seconds(self, model: Any, batch: int, steps: int = TIMED_STEPS) -> float:
        """Seconds per step at per-replica `batch`, run for real on zeros
        (after one step to warm up) from a copy of the model's state, which
        the steps consume (donated): the model is left as it is. Needs
        what `need(batch)` reports, plus the state, free on each device."""
        import numpy as np

        from kerascale import _keras_compat as keras_compat

        jax = self._jax
        data = keras.tree.map_structure(
            lambda s: jax.device_put(np.zeros(s.shape, s.dtype), s.sharding),
            self._data(batch * self.replicas),
        )
        state = jax.tree_util.tree_map(
            lambda a: a.copy(), keras_compat.train_state(model)
        )
        _, state = self._step(state, data)
        jax.block_until_ready(state)
        start = time.perf_counter()
        for _ in range(steps):
            _, state = self._step(state, data)
        jax.block_until_ready(state)
        return (time.perf_counter() - start) / steps

    def _data(self, global_batch: int) -> Any:
        jax = self._jax

        def spec(leaf: Any) -> Any:
            shape = (global_batch, *tuple(leaf.shape))
            sharding = None
            if self.distribution is not None:
                layout = self.distribution.get_data_layout(shape)
                sharding = getattr(layout, "backend_layout", layout)
            dtype = jax.dtypes.canonicalize_dtype(leaf.dtype)
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

        return keras.tree.map_structure(spec, self.element)


@dataclasses.dataclass(frozen=True)
class Compiles:
    """What a search's compiles found.

    Attributes:
        fits: The largest per-replica batch whose step fits (0: none).
        fails: The smallest that does not, or None where none failed.
        seen: Every compile, in order.
    """

    fits: int
    fails: int | None
    seen: list[Compiled]


def search(
    need: Callable[[int], Compiled],
    free_bytes: int,
    *,
    start: int,
    cap: int,
    max_compiles: int = MAX_COMPILES,
    measured: tuple[Compiled, ...] = (),
) -> Compiles:
    """(the largest per-replica batch found to fit `free_bytes`, the
    smallest found not to or None, every compile) in at most `max_compiles`
    compiles of `need`, between 1 and `cap`: the search's one bracket
    (`kerascale.measure.search.Bracket`) guided by a `Secant` through XLA's
    counts. `measured`: compiles made before (at `start`), counted in the
    budget.
    """
    compiles = {c.batch: c for c in measured}

    def probe(batch: int) -> ProbeResult:
        compiles[batch] = need(batch)
        return compiles[batch].as_probe(free_bytes)

    found = search_lib.bracket(
        probe,
        Secant(free_bytes, max(1, min(start, cap))),
        cap=cap,
        max_trials=max_compiles,
        limit_bytes=free_bytes,
        known=tuple(c.as_probe(free_bytes) for c in measured),
    )
    seen = [compiles[p.batch] for p in found.probes]
    return Compiles(found.lo, found.hi, seen)


class Secant:
    """JAX's guide (`search.Guide`): XLA counts what a step needs at any batch,
    fitting or not, so the next batch is where a line through two counts
    meets `free_bytes`. From `start`, double it for a second figure; until a
    batch fails, the secant through the last two (4x lo where that does not
    climb); once the bracket is closed on both sides, the secant between
    its ends (regula falsi), at least a tolerance in from each (on a curved
    figure, where XLA's rematerialisation bends it, regula falsi creeps
    from one side). It stops when the ends are within `TOLERANCE`."""

    def __init__(self, free_bytes: int, start: int):
        self.free_bytes, self.start = free_bytes, start

    def opening(self, s: search_lib.Bracket) -> list[int]:
        return [] if s.probes else [self.start]

    def up(self, s: search_lib.Bracket) -> int:
        seen = s.probes
        if len(seen) < 2:
            return 2 * seen[-1].batch
        step = _secant(seen[-2], seen[-1], self.free_bytes)
        return 4 * s.lo if step is None or step <= s.lo else step

    def inside(self, s: search_lib.Bracket) -> int | None:
        if not s.lo:  # nothing fits yet: the bracket's middle halves it
            return None
        fit, fail = s.probe_at(s.lo), s.probe_at(s.hi)
        step = _secant(fit, fail, self.free_bytes)
        if step is None:
            return None
        margin = _tolerance(s.lo)
        return max(s.lo + margin, min(step, s.hi - margin))

    def closed(self, s: search_lib.Bracket) -> bool:
        high = s.cap + 1 if s.hi is None else s.hi
        return high - s.lo <= max(1, _tolerance(s.lo))


def _tolerance(batch: int) -> int:
    return max(1, math.floor(batch * TOLERANCE))


def _secant(a: ProbeResult, b: ProbeResult, free_bytes: int) -> int | None:
    """Where the line through two counts meets `free_bytes`; None for a
    flat or falling pair."""
    da, db = a.peak_bytes, b.peak_bytes
    if b.batch == a.batch or (db - da) * (b.batch - a.batch) <= 0:
        return None
    slope = (db - da) / (b.batch - a.batch)
    return int(a.batch + (free_bytes - da) / slope)


def describe(found: list[Compiled], free_bytes: int) -> str:
    """The compiles, for the plan's reason."""
    steps = ", ".join(
        f"{c.batch}: {format_bytes(c.need_bytes)}"
        + ("" if c.need_bytes <= free_bytes else " (over)")
        for c in found
    )
    seconds = sum(c.seconds for c in found)
    return (
        f"{len(found)} compile{'s' if len(found) != 1 else ''} of the train step "
        f"({seconds:.1f}s), per replica: {steps}; {format_bytes(free_bytes)} free"
    )


def _one_sample(element: Any) -> Any:
    import numpy as np

    def zeros(leaf: Any) -> Any:
        return np.zeros((1, *tuple(leaf.shape)), dtype=leaf.dtype)

    return keras.tree.map_structure(zeros, element)


def _bytes_on_one_device(array: Any) -> int:
    """The bytes of `array` held on one device (its shard, or all of it)."""
    shards = getattr(array, "addressable_shards", None)
    if shards:
        return int(shards[0].data.nbytes)
    return int(array.nbytes)


def element_of(x: Any, y: Any) -> Any:
    """The per-sample `(x, y)` structure of arrays, as Keras's JAX trainer
    passes a batch to `train_step`."""
    import keras
    import numpy as np

    from kerascale.sense.data_facts import as_structure

    def leaf(a: Any) -> Any:
        a = a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a)
        return Spec(tuple(a.shape)[1:], a.dtype)

    inputs = keras.tree.map_structure(leaf, as_structure(x))
    return (inputs,) if y is None else (inputs, keras.tree.map_structure(leaf, y))


class Spec:
    """A leaf's per-sample shape and dtype."""

    def __init__(self, shape: tuple[int, ...], dtype: Any):
        self.shape, self.dtype = shape, dtype


def reported(
    step: Callable[..., Any], what: str = "Compiling the train step"
) -> Callable[..., Any]:
    """`step`, its failures (the model's own, found while building or tracing
    its step) raised as `BatchSizeSearchError`, as a TensorFlow probe's are:
    the plan then goes on without a search."""

    def reported(*args: Any, **kwargs: Any) -> Any:
        try:
            return step(*args, **kwargs)
        except Exception as e:
            at = f" at batch {args[0]}" if args and isinstance(args[0], int) else ""
            raise BatchSizeSearchError(
                f"{what}{at} failed, for a reason other than memory:\n"
                f"{type(e).__name__}: {gist(e)}"
            ) from e

    return reported
