"""Running the batch-size search for a plan: real probes (in child processes
or in this one), the memory limit and cap, the cache and progress lines
(`run_search`). The public door is `kerascale.find_batch_size`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from kerascale._display import said
from kerascale._units import format_bytes
from kerascale.errors import BatchSizeSearchError
from kerascale.measure import (
    cache,
    child,
    headroom,
    host_share,
    placement,
    probe_data,
    probe_memory,
)
from kerascale.measure import probe as probe_lib
from kerascale.measure.probe import ProbeSpec
from kerascale.measure.request import (
    Prepared,
    SearchOptions,
    SearchRequest,
)
from kerascale.measure.result import BatchSearchResult, ProbeResult, describe_probe
from kerascale.measure.search import granularity_for, search
from kerascale.plan import strategy as strategy_rules
from kerascale.plan.reasons import Reason
from kerascale.sense import samples
from kerascale.sense.model_facts import is_builder, state_bytes

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.hardware import Hardware

THROUGHPUT_TIMED_SECONDS = 1.0  # per probe; 0.3 s timings varied by 20% on 2 cores

# Without max_batch_size or a known dataset size, the search stops here.
HARD_CAP = 65536


def auto_mode(hw: Hardware) -> str:
    """What an "auto" search looks for: on a CPU the fastest batch that fits
    ("throughput": it times the batches; `fit` keeps Keras's 32 there, see
    `batch_plan.CPU_KEEPS_KERAS`), elsewhere the largest ("max")."""
    return "throughput" if hw.accelerator == "cpu" else "max"


def cap_for(data: DataFacts, plan: Plan, options: SearchOptions) -> tuple[int, Reason]:
    """The largest per-replica batch to search, and why."""
    caps = [(HARD_CAP, Reason("cap.ceiling", cap=HARD_CAP))]
    if options.max_batch_size:
        bound = options.max_batch_size // plan.replicas or 1
        caps.append((bound, Reason("cap.max_batch_size")))
    if data.num_samples:
        steps = options.min_steps_per_epoch
        per_replica = max(1, data.num_samples // (plan.replicas * steps))
        why = Reason("cap.dataset") if steps == 1 else Reason("cap.steps", steps=steps)
        caps.append((per_replica, why))
    return min(caps)


class Engine(Protocol):
    """How one backend measures a batch for `run_search`, which owns the
    rest (the cap, the cache, the host's share): TensorFlow's
    real steps (`Probes`), or JAX's compiled step's memory count
    (`measure.jax.search.Compiled`). Both answer with one bracket
    (`search.Bracket.largest`)."""

    def prepare(self, request: SearchRequest, cap: int) -> Prepared:
        """What the search measures, before the cache is read. Raises
        `SearchUnavailable` where the engine cannot answer."""

    def searched(
        self,
        prepared: Prepared,
        request: SearchRequest,
        capped: tuple[int, Reason],
        share: host_share.HostShare,
    ) -> BatchSearchResult:
        """The answer, measured (`capped`: the cap and why)."""

    def finished(self, prepared: Prepared) -> None:
        """Hands back what the measurements left in this process."""


def run_search(request: SearchRequest, engine: Engine) -> BatchSearchResult:
    """The largest (or, on a CPU's "throughput", the fastest) per-replica
    batch for `request.plan` (its precision, strategy, accumulation or
    `accumulation_steps`, recomputation), measured by the backend's
    `engine` (`engines.batch_search` picks it), `request.first` first.
    The one door of both engines' searches: the cap, the cache (read, and
    written with the answer), and the host's share of memory the answer
    must leave room for.

    Raises:
        SearchUnavailable: The engine cannot answer here.
        BatchSizeSearchError: Even the smallest batch does not fit, or the
            model fails for another reason.
    """
    given, plan, options = request.given, request.plan, request.options
    capped = cap_for(request.data, plan, options)
    cap = capped[0]
    prepared = engine.prepare(request, cap)
    key = cache.cache_key(
        {
            "model": cache.model_fingerprint(given.model),
            "hardware": request.hardware.to_dict(),
            "margin": options.margin,
            **prepared.key,
        }
    )
    cached = _cached(key, options, request.verbose)
    # Measured only for an answer to give: it reads the input (seconds).
    share = host_share.for_search(
        given.x,
        given.y,
        request.data,
        plan,
        memory_limit=options.memory_limit,
        on_host=prepared.on_host,
        start=prepared.start,
        cap=cap,
        measured=request.host_share,
        state_copy=state_bytes(given.model) if options.state_copy else 0,
    )
    slack = host_share.slack(options.memory_limit)
    if cached is not None and share.covered_by(
        cached.host_share, cached.batch_size, slack
    ):
        # With this process's share: the decision's later searches count it.
        return dataclasses.replace(cached, host_share=tuple(share.to_list()))
    found = engine.searched(prepared, request, capped, share)
    found = dataclasses.replace(found, host_share=tuple(share.to_list()))
    if options.cache:
        cache.cache_write("batch_search", key, found.to_dict())
    engine.finished(prepared)
    return found


@dataclasses.dataclass(frozen=True)
class _Probing:
    """What one search of TensorFlow's probes settled before the first.

    Attributes:
        request: The search asked for.
        options: Its options (the check of a requested batch narrows them).
        spec: What each probe trains.
        mode: "max" or "throughput".
        cap: The largest per-replica batch searched.
        first: The per-replica batch probed first, or None.
        placed: Where probes run, and why.
        in_children: The memory probes have in child processes.
        here: The memory probes have in this process.
    """

    request: SearchRequest
    options: SearchOptions
    spec: ProbeSpec
    mode: str
    cap: int
    first: int | None
    placed: placement.Placement
    in_children: probe_memory.Memory
    here: probe_memory.Memory


class Probes:
    """TensorFlow's engine: real training steps, each batch probed where
    `placement.place` says (children forked from one server, or this
    process), the bracket guided by a memory model of what they took."""

    def prepare(self, request: SearchRequest, cap: int) -> Prepared:
        hw, plan, options = request.hardware, request.plan, request.options
        # Where probes run decides their memory (GPUs); see `_found`'s fallback.
        in_children, here = probe_memory.memories(hw, plan, options)
        mode = auto_mode(hw) if options.mode == "auto" else options.mode
        placed = placement.place(
            request.given.model,
            hw,
            plan,
            options,
            request.instance,
            mode=mode,
            # The same on a CPU (the only place with room here first).
            limit=in_children.predict,
        )
        memory = in_children if placed.in_children else here
        long = request.timed or mode == "throughput"
        spec = _spec(request, long=long, memory=memory)
        key = {
            # The limit as asked for: a default limit follows the memory free
            # at this moment, which must not make every search a cache miss.
            # What this process holds is checked against the cached answer's
            # (`HostShare.covered_by`): a few MB apart must not be a miss.
            # So is the optimizer's state: built by the first fit, it is in
            # this process's memory for the next call.
            "spec": dataclasses.replace(
                spec,
                memory_limit=options.memory_limit,
                host_share=(),
                optimizer_built=True,
            ).to_json(),
            "result": 2,  # batch_size is global since version 2 of the result
            "mode": mode,
            "cap": cap,
            "first": request.first,
            "isolate": placed.in_children,
        }
        probing = _Probing(
            request,
            options,
            spec,
            mode,
            cap,
            request.first,
            placed,
            in_children,
            here,
        )
        on_host = hw.accelerator == "cpu"
        return Prepared(mode, key, on_host, request.first or 32, probing)

    def searched(
        self,
        prepared: Prepared,
        request: SearchRequest,
        capped: tuple[int, Reason],
        share: host_share.HostShare,
    ) -> BatchSearchResult:
        probing = prepared.state
        spec = dataclasses.replace(probing.spec, host_share=tuple(share.to_list()))
        probing = dataclasses.replace(probing, spec=spec)
        memory = probing.in_children if probing.placed.in_children else probing.here
        if request.verbose != 0:
            print(
                f"kerascale: searching the batch size ({probing.mode}, up to "
                f"{probing.cap} per replica, limit {format_bytes(memory.predict)})...",
                flush=True,
            )
        found, ran = _found_checked(probing)
        memory = memory if ran.in_children else probing.here
        whys = {"cap": capped[1], "isolate": ran.why}
        return _reported(found, request.plan, spec, memory, whys, share)

    def finished(self, prepared: Prepared) -> None:
        return None


def _reported(
    found: BatchSearchResult,
    plan: Plan,
    spec: ProbeSpec,
    memory: probe_memory.Memory,
    whys: dict[str, str],
    share: host_share.HostShare,
) -> BatchSearchResult:
    """The probes' answer for `plan`, global, with every reason."""
    seconds = sum(p.seconds for p in found.probes)
    reasons = {
        **found.reasons,
        "limit": memory.why,
        **whys,
        "memory": Reason(
            "search.memory",
            measured=memory.measured,
            share=share.why,
            threshold_fixed=share.threshold_fixed,
        ),
        "search": Reason(
            "search.probes",
            probes=len(found.probes),
            seconds=seconds,
            measured=memory.measured,
        ),
    }
    return dataclasses.replace(
        found,
        replicas=plan.replicas,
        batch_size=found.per_replica_batch_size * plan.replicas,
        precision=spec.policy,
        strategy=plan.strategy,
        reasons=reasons,
        host_share=spec.host_share,
    )


def _cached(key: str, options: SearchOptions, verbose: Any) -> BatchSearchResult | None:
    """The cached result for `key`, said, unless the options refuse it."""
    if not options.cache or options.force:
        return None
    cached = cache_load(key)
    if cached is not None and verbose != 0:
        print(
            f"kerascale: batch size {cached.per_replica_batch_size} per replica "
            f"from the cache ({cache.cache_dir()})",
            flush=True,
        )
    return cached


def _found_checked(
    probing: _Probing,
) -> tuple[BatchSearchResult, placement.Placement]:
    """`_found`; for the check of a requested batch (probed `first`, capped
    there, with accumulators for the split it may need), the batch probed
    alone first, once: a batch that fits in one pass needs no split, so no
    accumulators. Only where it does not is the largest micro-batch searched
    with them, not starting at the batch that just failed."""
    first, spec = probing.first, probing.spec
    if first is None or first < probing.cap or spec.accumulation_steps < 2:
        return _found(probing)
    alone = dataclasses.replace(
        probing,
        spec=dataclasses.replace(spec, accumulation_steps=1),
        options=dataclasses.replace(probing.options, max_trials=1),
    )
    try:
        found = _found(alone)
    except BatchSizeSearchError as e:
        if not e.out_of_memory:
            raise
    else:
        result, ran = found
        if result.per_replica_batch_size >= first:
            reasons = {**result.reasons, "accumulation": Reason("search.one_pass")}
            return dataclasses.replace(result, reasons=reasons), ran
    return _found(dataclasses.replace(probing, first=None))


def _found(probing: _Probing) -> tuple[BatchSearchResult, placement.Placement]:
    """The search, with probes where `probing.placed` says (in this process
    first while its `placement.Room` admits them), in this process when a
    child cannot load the model; and where they ran."""
    model, spec, options = probing.request.given.model, probing.spec, probing.options
    placed = probing.placed
    room = placed.room
    if placed.in_children:
        # A child needs a model instance to save; a builder is called once.
        shipped = model() if is_builder(model) else model

        def isolated():
            return child.IsolatedProber(
                shipped, spec, timeout=options.timeout, fork=placed.forked
            )

        prober = (
            headroom.HeadroomProber(
                # The guard keeps these far below the limit (which counts
                # what is free, not what this process holds), where a
                # validation step's memory cannot matter.
                probe_lib.InProcessProber(
                    model, dataclasses.replace(spec, memory_limit=None, validate=False)
                ),
                room.limit,
                room.prior,
                isolated,
                as_growth=not spec.share().resident,
            )
            if room
            else isolated()
        )
        try:
            found = _probe(prober, probing, probing.in_children)
            if room:
                why, in_children = prober.where()
                return found, dataclasses.replace(
                    placed, in_children=in_children, why=why
                )
            return found, placed
        except child.CannotShip as e:
            if options.isolate is True:
                raise BatchSizeSearchError(
                    f"isolate=True, but the model cannot be probed in a child "
                    f"process: {e}. Move its custom objects to an importable "
                    'module, or pass isolate="auto" or False to probe in this '
                    "process."
                ) from e
            placed = placed.here(Reason("isolate.cannot_ship", problem=str(e)))
    instance = probing.request.instance
    prober = probe_lib.InProcessProber(model, spec, strategy=instance)
    return _probe(prober, probing, probing.here), placed.here()


def _spec(
    request: SearchRequest, *, long: bool, memory: probe_memory.Memory
) -> ProbeSpec:
    """What each probe of `request` trains: `long` where speed decides."""
    given, plan = request.given, request.plan
    hw, options = request.hardware, request.options
    element = samples.element_structure(given.x, given.y, request.data)
    optimizer = getattr(given.model, "optimizer", None)
    return ProbeSpec(
        optimizer_built=optimizer is None or bool(optimizer.built),
        element=probe_data.encode_structure(element),
        policy=plan.precision,
        # A worker of a cluster probes alone, on its own devices.
        strategy=strategy_rules.local_equivalent(plan.strategy, tuple(plan.devices)),
        devices=tuple(plan.devices),
        logical_cpus=hw.cpu.logical_devices,
        steps=options.steps_per_trial,
        validate=True,
        accumulation_steps=request.accumulation_steps or plan.accumulation_steps,
        memory_limit=memory.enforce,
        on_gpu=hw.accelerator == "gpu",
        # Where speed decides, each probe is timed long enough.
        timed_seconds=THROUGHPUT_TIMED_SECONDS if long else probe_lib.MIN_TIMED_SECONDS,
        recompute=getattr(plan, "recompute", ""),
    )


def _probe(prober, probing: _Probing, memory: probe_memory.Memory) -> BatchSearchResult:
    """`probing`'s search on `prober`'s probes, under `memory`."""
    hw, options = probing.request.hardware, probing.options
    verbose = probing.request.verbose

    def progress(r: ProbeResult) -> None:
        if verbose != 0:
            print(said(f"kerascale: batch search: {describe_probe(r)}"), flush=True)

    with prober:
        try:
            return search(
                prober,
                cap=probing.cap,
                limit_bytes=memory.predict,
                granularity=granularity_for(hw.accelerator, probing.cap),
                margin=options.margin,
                mode=probing.mode,
                max_trials=options.max_trials,
                sweep=prober.sweep,
                on_probe=progress,
                first=probing.first,
            )
        except BatchSizeSearchError as e:
            if not e.out_of_memory:
                raise
            baseline = prober.baseline_bytes()
            if hw.accelerator == "gpu":
                hint = f"The GPU memory the probes had: {memory.why}."
            elif baseline:
                hint = (
                    f"TensorFlow and the model alone took {format_bytes(baseline)} "
                    "of resident memory before the first batch; memory_limit must "
                    "leave room above that."
                )
            else:
                raise
            raise BatchSizeSearchError(f"{e}\n{hint}", out_of_memory=True) from None


def cache_load(key: str) -> BatchSearchResult | None:
    """The cached search result for `key`, or None (absent or unreadable)."""
    d = cache.cache_read("batch_search", key)
    try:
        return dataclasses.replace(BatchSearchResult.from_dict(d), cached=True)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # absent or unreadable: search again
