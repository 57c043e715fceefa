"""A batch-size search as `batch.run_search` takes it, for either engine
(`engines.batch_search`: TensorFlow's probes, XLA's count on JAX): its
options (`SearchOptions`, validated at the door) and the request
(`SearchRequest`)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from kerascale import _validation
from kerascale._units import parse_bytes

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.hardware import Hardware

DEFAULT_MARGIN = 0.03
# An "auto" batch leaves an epoch at least this many optimizer updates.
AUTO_MIN_STEPS = 8
MODES = ("max", "throughput")  # what a search may find, besides "auto"


@dataclasses.dataclass(frozen=True)
class Given:
    """The user's model (or builder) and training data, as the door got
    them: what every stage of a decision measures."""

    model: Any
    x: Any
    y: Any = None


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Validated batch-search options (see `find_batch_size`)."""

    mode: str = "auto"
    isolate: Any = "auto"
    memory_limit: int | None = None
    # Per device: what a GPU reports, given for CPU devices (or a device
    # you plan for); decides sharding on JAX (`measure.jax.replica_fit`).
    device_memory: int | None = None
    max_batch_size: int | None = None
    steps_per_trial: int = 3
    margin: float = DEFAULT_MARGIN
    max_trials: int = 20
    timeout: float = 600.0
    cache: bool = True
    force: bool = False
    # Optimizer updates an epoch must keep: fit's "auto" asks for several, so
    # that a small dataset is not swallowed by one huge batch.
    min_steps_per_epoch: int = 1
    # The run writes checkpoints behind training (a FaultTolerantBackup's
    # async_save): a host copy of the model's and optimizer's variables is
    # held beside its steps while one is written, where the host's memory
    # is the budget (truth in the user's process).
    state_copy: bool = False

    @classmethod
    def validate(cls, **kwargs: Any) -> SearchOptions:
        """Checks every option at the door; raises `ConfigurationError`."""
        o = cls(**kwargs)
        _validation.one_of("mode", o.mode, ("auto", *MODES))
        if o.isolate != "auto" and not isinstance(o.isolate, bool):
            raise _validation.fail("isolate", o.isolate, '"auto", True or False')
        limit = (
            None
            if o.memory_limit is None
            else parse_bytes("memory_limit", o.memory_limit)
        )
        if o.max_batch_size is not None:
            _validation.positive_int(
                "max_batch_size", o.max_batch_size, accepted="a positive int or None"
            )
        _validation.positive_int("steps_per_trial", o.steps_per_trial)
        m = o.margin
        if (
            isinstance(m, bool)
            or not isinstance(m, int | float)
            or math.isnan(m)
            or not 0 <= m < 0.5
        ):
            raise _validation.fail("margin", m, "a fraction in [0, 0.5)")
        _validation.positive_int("max_trials", o.max_trials)
        t = o.timeout
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise _validation.fail("timeout", t, "a positive number of seconds")
        _validation.boolean("cache", o.cache)
        _validation.boolean("force", o.force)
        device = (
            None
            if o.device_memory is None
            else parse_bytes("device_memory", o.device_memory)
        )
        return dataclasses.replace(o, memory_limit=limit, device_memory=device)


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """One batch-size search.

    Attributes:
        given: The user's model (or builder) and training data, as the door
            got them.
        data: Facts about the data.
        plan: The plan searched for: its precision, strategy, accumulation
            and recomputation.
        hardware: What is here.
        options: The search's options (the memory bounds, the mode).
        instance: The user's own `tf.distribute.Strategy`, or None.
        verbose: `fit`'s verbosity: a line before a search that probes.
        first: The per-replica batch tried first (a requested one), or None.
        accumulation_steps: Accumulators held beside the micro-batch (the
            split a requested batch will need), or None for the plan's.
        timed: The largest batch that fits also runs real steps (where its
            speed decides).
        host_share: On a CPU, what the process where `fit` trains holds
            beside a step, as an earlier search of the same decision
            measured it (`measure.host_share.HostShare.to_list`), or () to
            measure it now. A later search (recomputation's) takes it: the
            trials have trained in this process since, and what TensorFlow
            keeps of their steps is reused by training's, not held beside
            it (a CNN's process held 1170 MiB after its trials, 771 before,
            and every probe of the search after them counted the 400 MiB).
    """

    given: Given
    data: DataFacts
    plan: Plan
    hardware: Hardware
    options: SearchOptions
    instance: Any = None
    verbose: Any = "auto"
    first: int | None = None
    accumulation_steps: int | None = None
    timed: bool = False
    host_share: tuple = ()


class SearchSkipped(Exception):
    """The search would cost more than the run it tunes can repay; says why.
    `hint`: what the user can do instead (None: search anyway, by hand)."""

    hint: str | None = None


class SearchUnavailable(SearchSkipped):
    """The search cannot answer here (this backend, this device); says why."""

    hint = "pass batch_size= to choose"


class SearchDeclined(SearchSkipped):
    """The search's answer would not serve the run: Keras's batch is kept;
    says why."""

    hint = (
        "pass batch_size= to choose one (kerascale.callbacks.NoiseScale "
        "measures whether a larger one would pay)"
    )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What an engine settled for one search before its first measurement.

    Attributes:
        mode: "max" or "throughput".
        key: The engine's parts of the cache key, by name (`run_search`
            adds the model, the hardware and the margin).
        on_host: Whether the host's memory is the budget, so the input's
            share of it counts.
        start: The per-replica batch measured first.
        state: The engine's own: what its measurements need.
    """

    mode: str
    key: dict[str, Any]
    on_host: bool
    start: int
    state: Any = None


def check_options(search: SearchOptions | None, batch_size: int) -> SearchOptions:
    """The search that checks a requested (global) `batch_size`: the largest
    micro-batch up to it."""
    return dataclasses.replace(
        search or SearchOptions(),
        mode="max",
        max_batch_size=batch_size,
        min_steps_per_epoch=1,
    )


def request_for(
    decided: Any, given: Given, plan: Plan, options: SearchOptions | None, **run: Any
) -> SearchRequest:
    """The search for `plan` over the facts of `decided` (a
    `decided.Decided`, named not imported: a request is a value below it),
    with its strategy instance and verbosity unless `run` says otherwise."""
    run.setdefault("instance", decided.instance)
    run.setdefault("verbose", decided.options.verbose)
    return SearchRequest(given, decided.data, plan, decided.hardware, options, **run)
