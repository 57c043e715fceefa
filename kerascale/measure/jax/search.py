"""The batch-size search on the JAX backend: `compiled.search` on the model
as it will train, against the memory free on one device, as a
`BatchSearchResult` (the same record the TensorFlow path's probes give).

The model is prepared on the one path (`Session.model_for`: its
distribution set, its variables laid out, its precision set in place, all
put back after), with no copy: a second copy of the weights on the device
would take the memory the search is measuring. What the search leaves in the
model is what Keras's first training step builds anyway: the optimizer's
slots and the compiled metrics' variables (zeros).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import keras

from kerascale._units import format_bytes
from kerascale.apply.jax import reader
from kerascale.apply.session import Session
from kerascale.errors import BatchSizeSearchError
from kerascale.measure import host_share
from kerascale.measure.jax import compiled, confirm, device_free
from kerascale.measure.request import Prepared, SearchOptions, SearchUnavailable
from kerascale.measure.result import BatchSearchResult
from kerascale.measure.search import granule_at, round_down
from kerascale.plan.reasons import Reason
from kerascale.sense import memory

if TYPE_CHECKING:
    from kerascale.measure.request import SearchRequest
    from kerascale.plan.plan import Plan
    from kerascale.sense.hardware import Hardware

# Where the search starts when nothing else says (Keras's default batch).
START = 32
ROUND_TO = 8  # the granule from search.ROUND_FROM up, on every accelerator


@dataclasses.dataclass(frozen=True)
class _Setting:
    """What one compiled search settled before its first compile: the
    data's element, whether the host's memory is the budget, the batches
    read ahead."""

    element: Any
    host: bool
    held: int


class XlaAnalysis:
    """JAX's engine for `batch.run_search`: the largest per-replica batch
    whose compiled step fits, for `request.plan` (its precision and
    distribution), by XLA's memory analysis. The step compiled is the
    micro-batch's, with the memory of `accumulation_steps`' accumulators held
    beside it, and of the batches `Prefetch` reads ahead where the plan has
    it. `request.timed`: the largest batch that fits also runs a few real steps
    (`_timed`). On a CPU, real steps in a child confirm the answer
    (`confirm.confirmed`)."""

    def prepare(self, request: SearchRequest, cap: int) -> Prepared:
        """Raises `SearchUnavailable` on a CPU asked for the fastest batch
        without a memory limit (XLA's count times nothing)."""
        given, plan = request.given, request.plan
        hw, options = request.hardware, request.options
        _answerable(hw, options)
        # With device_memory, a CPU device counts as a device of its own.
        host = hw.accelerator == "cpu" and not options.device_memory
        element = compiled.element_of(given.x, given.y)
        held = reader.HELD if plan.data_changes.read_ahead else 0
        shapes = keras.tree.map_structure(
            lambda leaf: (tuple(leaf.shape), str(leaf.dtype)), element
        )
        # The limit as asked for: a default limit follows the memory free
        # now, which must not make each search a miss.
        key = {
            "search": "jax-compiled-3",
            "element": repr(shapes),
            "plan": [
                plan.precision,
                plan.strategy,
                plan.replicas,
                getattr(plan, "recompute", ""),
            ],
            "limit": options.memory_limit,
            "isolate": options.isolate,
            "cap": cap,
            "first": request.first,
            "accumulation": request.accumulation_steps,
            "ahead": held,
            "mode": options.mode,
            "timed": request.timed,
        }
        start = request.first or min(cap, START)
        return Prepared(options.mode, key, host, start, _Setting(element, host, held))

    def searched(
        self,
        prepared: Prepared,
        request: SearchRequest,
        capped: tuple[int, Reason],
        share: host_share.HostShare,
    ) -> BatchSearchResult:
        setting = prepared.state
        searched, free = _compiled(
            request,
            setting.element,
            setting.host,
            start=prepared.start,
            cap=capped[0],
            held=setting.held,
            share=share,
        )
        return _answer(
            request.given.model,
            setting.element,
            request.plan,
            request.options,
            setting.host,
            searched,
            free,
            capped,
            share=share,
        )

    def finished(self, prepared: Prepared) -> None:
        # The search's compiles (and the model saved for the confirming child)
        # leave garbage and freed heap: training in this process must start
        # from what the budget above was read against.
        if prepared.state.host:
            _release_compiles()


def _release_compiles() -> None:
    """Hands back what the search's compiles hold in this process (JAX's
    in-memory caches of traced and compiled functions: 19 MB after five
    compiles of an MLP) and the heap the compiler freed: training in this
    process compiles its own step, and must find the room the budget saw."""
    import jax

    jax.clear_caches()
    memory.release_freed()


@dataclasses.dataclass(frozen=True)
class Chosen:
    """The search's answer: the batch, the step a caller may move it by,
    and what the confirming real steps said ("" where none ran)."""

    batch: int
    granularity: int
    confirmed: str = ""


def _compiled(
    request: SearchRequest,
    element: Any,
    host: bool,
    *,
    start: int,
    cap: int,
    held: int,
    share: host_share.HostShare,
) -> tuple[compiled.Compiles, tuple[int, Reason]]:
    """The compiles of `run_search`, in a session that puts everything back:
    (what they found, (the bytes free, why)). `host`: whether the
    host's memory is the budget; `start`, `cap`: the first and the largest
    batch; `held`: the batches read ahead."""
    model, plan, hw = request.given.model, request.plan, request.hardware
    options, instance = request.options, request.instance
    accumulation_steps, timed = request.accumulation_steps, request.timed
    with Session() as session:
        # model_for sets the run's distribution, and JAX's compilation cache
        # with it (`apply.jax.distribution.activated`): training finds there
        # the compile of the batch it trains at.
        trained, dist = session.model_for(model, plan, instance=instance)
        step = compiled.reported(
            compiled.StepMemory, "Building the train step's state"
        )(
            trained,
            element,
            dist,
            plan.replicas,
            host=host,
            held_batches=held,
            held_bytes=share.held_bytes if share.measured else None,
        )
        # Read after the step's state is built (the optimizer's slots) and a
        # first compile (the compiled program, held while training), less
        # the heap the compiler freed, which a CPU process would keep.
        need = compiled.reported(step.need)
        first_compile = need(max(1, min(start, cap)))
        if host:
            _release_compiles()
        alone = device_free.for_step(hw, options, step)
        free, why_free = device_free.less_accumulators(
            *alone, step, trained, accumulation_steps, host
        )
        if first_compile.batch >= cap and first_compile.need_bytes <= alone[0]:
            free, why_free = alone  # it fits in one pass: no accumulators
        found = compiled.search(
            need, free, start=start, cap=cap, measured=(first_compile,)
        )
        if timed:
            seen = _timed(
                step, trained, found.fits, found.seen, hw=hw, options=options, host=host
            )
            found = dataclasses.replace(found, seen=seen)
    return found, (free, why_free)


def _answer(
    model: Any,
    element: Any,
    plan: Plan,
    options: SearchOptions,
    host: bool,
    searched: compiled.Compiles,
    limit: tuple[int, Reason],
    capped: tuple[int, Reason],
    *,
    share: host_share.HostShare,
) -> BatchSearchResult:
    """The search's answer from its compiles: the batch (on a CPU confirmed
    by a real step in a child). `capped`: the
    largest batch the search may answer, and why."""
    fits, fails, seen = searched.fits, searched.fails, searched.seen
    free, why_free = limit
    cap, why_cap = capped
    if fits == 0:
        raise BatchSizeSearchError(
            f"Even a batch of {seen[-1].batch} per replica needs "
            f"{format_bytes(seen[-1].need_bytes)} per device by XLA's count, more "
            f"than the {format_bytes(free)} free ({why_free}).",
            out_of_memory=True,
        )
    chosen, granularity = _with_margin(fits, fails, options.margin)
    confirmed = ""
    if host and _confirmable(plan) and options.isolate is not False:
        # As far as real steps show room: XLA's count is not the truth on a
        # CPU (it missed a conv net's scratch, and overstated others). The
        # margin is at least the slack a process's own noise needs: a fresh
        # process's step at the answer went 4 MB over 1 GiB under CI's load.
        kept = max(options.margin, host_share.slack(options.memory_limit) / free)
        chosen, confirmed = confirm.confirmed(
            model,
            element,
            plan,
            chosen,
            seen,
            (free, kept, cap),
            held_bytes=share.held_bytes if share.measured else None,
        )
        granularity = granule_at(chosen, ROUND_TO)
        chosen = round_down(chosen, ROUND_TO)
    answer = Chosen(chosen, granularity, confirmed)
    return _result(plan, options, searched, limit, why_cap, answer)


def _confirmable(plan: Plan) -> bool:
    """Whether a child can train as `plan` does: one device, or data
    parallelism over the CPU's devices (kerascale's, or a `DataParallel` of
    the user's). Another distribution of the user's (a `ModelParallel`'s
    layouts) is not rebuilt in a child, so not confirmed."""
    return plan.replicas == 1 or plan.strategy in ("data_parallel", "DataParallel")


def _result(
    plan: Plan,
    options: SearchOptions,
    searched: compiled.Compiles,
    free: tuple[int, Reason],
    why_cap: Reason,
    answer: Chosen,
) -> BatchSearchResult:
    free_bytes_, why_free = free
    fits, fails, seen = searched.fits, searched.fails, searched.seen
    chosen, granularity, confirmed = answer.batch, answer.granularity, answer.confirmed
    why = Reason(
        "search.compiled",
        fits=fits,
        fails=fails,
        cap=why_cap,
        margin=options.margin if chosen < fits else 0,
        counted=compiled.describe(seen, free_bytes_),
        confirmed=confirmed,
    )
    return BatchSearchResult(
        batch_size=chosen * plan.replicas,
        per_replica_batch_size=chosen,
        replicas=plan.replicas,
        precision=plan.precision,
        strategy=plan.strategy,
        largest_fitting=max(fits, chosen),  # a real step's, stepped up
        smallest_failing=fails,
        mode="max",
        probes=tuple(c.as_probe(free_bytes_) for c in seen),
        memory_model=None,
        limit_bytes=free_bytes_,
        granularity=granularity,
        margin=options.margin,
        reasons={
            "batch_size": why,
            "search": Reason("search.xla", compiles=len(seen)),
            "limit": why_free,
        },
    )


def _answerable(hw: Hardware, options: SearchOptions) -> None:
    """Raises `SearchUnavailable` on a CPU asked for the fastest batch
    without a memory limit: XLA's count finds what fits, and times nothing."""
    if hw.accelerator != "cpu" or options.mode == "max":
        return
    if not options.memory_limit:
        raise SearchUnavailable(
            "on a CPU the largest batch that fits is not the fastest, and this "
            "search times no batch: it counts what a compiled step needs"
        )


def _with_margin(fits: int, fails: int | None, margin: float) -> tuple[int, int]:
    """The batch to train at (the margin kept below the largest that fits,
    where a larger one was found not to), rounded down to a multiple of
    `ROUND_TO` from `search.ROUND_FROM` up (at most 1.4% less); and that
    granularity."""
    chosen = fits if fails is None else math.floor(fits * (1 - margin))
    return round_down(chosen, ROUND_TO), granule_at(chosen, ROUND_TO)


def _timed(
    step: compiled.StepMemory,
    trained: Any,
    fits: int,
    seen: list[compiled.Compiled],
    *,
    hw: Hardware,
    options: SearchOptions,
    host: bool,
) -> list[compiled.Compiled]:
    """`seen` with the compile at `fits` timed by a few real steps, where
    they fit the memory free now (`device_free.free_bytes`: the device's, or on CPU
    devices this process's): the step's buffers and a copy of the state,
    which the steps consume; as it was otherwise. `host`: whether the
    devices are the host's."""
    try:
        unset = dataclasses.replace(options, device_memory=None)
        free, _ = device_free.free_bytes(hw, unset)
    except SearchUnavailable:
        return seen
    out = []
    for c in seen:
        taken = (c.need_bytes + step.state_bytes) * (step.replicas if host else 1)
        if c.batch == fits and taken <= free:
            try:
                speed = fits * step.replicas / step.seconds(trained, fits)
            except Exception:  # kerascale's own timing: the batch is untimed
                speed = None
            c = dataclasses.replace(c, samples_per_s=speed)
        out.append(c)
    return out
