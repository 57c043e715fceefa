"""The rules: `make_plan` decides strategy, precision, batch, accumulation,
learning-rate factor and data changes from what is here (`Hardware`), what the
user asked for (`Options`) and facts about the model and data. Pure: it
touches no TensorFlow state, so every rule is testable with a fake `Hardware`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kerascale.errors import ConfigurationError, ModelError
from kerascale.plan import accumulation as accumulation_rules
from kerascale.plan import batch_split, device_split
from kerascale.plan import model_sharding as sharding
from kerascale.plan import precision as precision_rules
from kerascale.plan import steps as steps_rules
from kerascale.plan import strategy as strategy_rules
from kerascale.plan.choice import StrategyChoice
from kerascale.plan.data_changes import DataChanges
from kerascale.plan.measured import NOTHING, Measured, SearchAnswer
from kerascale.plan.options import Options
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason
from kerascale.sense import backend as backend_lib
from kerascale.sense import data_facts, jax_processes
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

# Keras's own default when `fit` gets arrays and no batch size.
DEFAULT_BATCH_PER_REPLICA = 32


def make_plan(
    hardware: Hardware,
    options: Options,
    model: ModelFacts,
    data: DataFacts,
    *,
    search: SearchAnswer | None = None,
    measured: Measured = NOTHING,
) -> Plan:
    """Decides strategy, precision, batch and data handling. Pure.

    Args:
        hardware: What is here (`detect_hardware()` or a fake).
        options: The validated user options.
        model: Facts about the model.
        data: Facts about the training data.
        search: A `BatchSearchResult` for this plan's precision and strategy,
            which decides an "auto" batch.
        measured: What planning measured beyond the rules: in the reasons
            and warnings, as the plan states it.

    Returns:
        The `Plan`.

    Raises:
        ConfigurationError: If the options cannot be met here (e.g. a batch not
            divisible by the number of replicas).
        ClusterConfigError: For a malformed cluster description.
        UnsupportedError: For a cluster task that does not train.
    """
    where = _split_or_one_device(
        hardware, options, data, model, _placement(hardware, options, model)
    )
    replicas = where.replicas
    reasons, warnings = dict(where.reasons), list(where.warnings)
    options = _as_fit_reads(options, data, hardware, warnings)
    requested, why_batch = _choose_batch(options, data, replicas, search)
    requested, why_batch, capped = _within_data(
        requested, why_batch, data, replicas, options.batch_size != "auto"
    )
    sp, batch_warnings = accumulation_rules.for_request(
        options, data, requested, replicas, search
    )
    warnings += capped + batch_warnings
    global_batch = sp.micro * replicas * sp.steps
    reasons["global_batch_size"] = why_batch
    reasons["accumulation_steps"] = sp.why
    factor, about_the_rate = _rate(options, data, global_batch)
    reasons |= about_the_rate
    data_changes, why_data = _data_changes(
        options, data, sp.micro * replicas, replicas, hardware.backend
    )
    reasons["data_changes"] = why_data
    split, split_warnings = _split(hardware, where, data, sp.micro * replicas)
    data_changes = dataclasses.replace(data_changes, **split)
    warnings += split_warnings
    recompute = _recompute(options, reasons)
    steps = _steps_per_execution(
        options, model, reasons, warnings, where.strategy, replicas, hardware.backend
    )
    if measured.materialized:
        data_changes = dataclasses.replace(data_changes, materialized=True)
    reasons, stated = measured.stated(reasons, tuple(warnings))
    return Plan(
        strategy=where.strategy,
        devices=tuple(where.devices),
        replicas=replicas,
        precision=where.policy,
        micro_batch_size=sp.micro,
        accumulation_steps=sp.steps,
        global_batch_size=global_batch,
        lr_factor=factor,
        rebuild=where.rebuild,
        data_changes=data_changes,
        hardware=hardware.summary(),
        reasons=reasons,
        warnings=stated,
        backend=hardware.backend,
        sharding=sharding.plan_field(options.strategy),
        recompute=recompute,
        steps_per_execution=steps,
    )


def _as_fit_reads(
    options: Options, data: DataFacts, hardware: Hardware, warnings: list[str]
) -> Options:
    """`options` as Keras's `fit` reads this input (a PyDataset's own batch
    size wins, as `fit` ignores `batch_size` there), what is ignored or
    passed through said in `warnings`."""
    if data.kind == "pydataset" and options.batch_size not in ("auto", data.batch_size):
        warnings.append(
            f"batch_size={options.batch_size} is ignored for a keras.utils.PyDataset, "
            f"as model.fit ignores it: the PyDataset's own batches of "
            f"{data.batch_size} train. Change its batch size to change them."
        )
        options = dataclasses.replace(options, batch_size="auto")
    passthrough = data_facts.passthrough_reason(data, hardware.backend)
    if passthrough:
        warnings.append(passthrough)
    return options


def _recompute(options: Options, reasons: dict[str, Reason]) -> str:
    """The plan's recomputation as you asked for it, its reason set in
    `reasons` ("auto" is weighed later, by `measure.recompute`)."""
    if options.recompute == "auto":
        return ""
    if options.recompute == "activations":
        reasons["recompute"] = Reason("recompute.asked")
        return "activations"
    reasons["recompute"] = Reason("recompute.off")
    return ""


def _steps_per_execution(
    options: Options,
    model: ModelFacts,
    reasons: dict[str, Reason],
    warnings: list[str],
    strategy: str,
    replicas: int,
    backend: str,
) -> int:
    """Training steps per call: yours (`fit`'s argument, then `compile`'s),
    else one, its reason set in `reasons` ("auto" is measured later, by
    `measure.host_path`, which sets the option and its reason). One under a
    `tf.distribute` strategy of several replicas, where Keras's TensorFlow
    fit fails at more (keras-team/keras#19246): a value of yours is then
    dropped with a warning."""
    asked = options.steps_per_execution
    yours = asked if isinstance(asked, int) else model.steps_per_execution
    if steps_rules.held_by_replicas(backend, replicas):
        why = Reason("steps.replicas", strategy=strategy, replicas=replicas)
        reasons["steps_per_execution"] = why
        if yours > 1:
            where = "you passed" if isinstance(asked, int) else "your compile's"
            warnings.append(
                f"steps_per_execution={yours} ({where}) was not applied: Keras's "
                f"TensorFlow fit fails at several steps a call under {strategy} "
                f"with {replicas} replicas (keras-team/keras#19246). Trained at 1 "
                "a call; strategy='one_device' trains at yours on one device."
            )
        return 1
    if isinstance(asked, int):
        reasons["steps_per_execution"] = Reason("steps.asked", n=asked)
        return asked
    if model.steps_per_execution > 1:
        n = model.steps_per_execution
        reasons["steps_per_execution"] = Reason("steps.compiled", n=n)
        return n
    reasons["steps_per_execution"] = Reason("steps.default", why="not measured")
    return 1


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where the model trains and in which dtype: the strategy's and the
    precision's decisions, with re-creation (or its fallback)."""

    strategy: str
    devices: tuple[str, ...]
    replicas: int
    policy: str
    rebuild: bool
    reasons: dict[str, Reason]
    warnings: tuple[str, ...]


def _placement(hardware: Hardware, options: Options, model: ModelFacts) -> _Placement:
    choice = strategy_rules.choose(hardware, options.strategy)
    policy, why_policy, policy_warnings = precision_rules.choose(
        hardware, options.precision, model_policy=model.policy
    )
    warnings = [*choice.warnings, *policy_warnings]
    needs_new_scope = (
        choice.scoped and choice.name != "default" and not model.in_strategy_scope
    )
    rebuild = model.builder or needs_new_scope
    if rebuild and not model.rebuildable:
        return _as_it_is(hardware, choice, policy, why_policy, model, warnings)
    if model.unplaceable and choice.name != "default":
        return _on_one_device(
            hardware, choice.name, policy, why_policy, model, warnings
        )
    if model.builder:
        why_rebuild = Reason("rebuild.builder")
    elif rebuild:
        why_rebuild = Reason(
            "rebuild.scope", strategy=choice.name, old=model.policy, new=policy
        )
    else:
        why_rebuild = _as_it_is_reason(model, policy)
    reasons = {
        "strategy": choice.reason,
        "precision": why_policy,
        "rebuild": why_rebuild,
    }
    return _Placement(
        choice.name,
        tuple(choice.devices),
        choice.replicas,
        policy,
        rebuild,
        reasons,
        tuple(warnings),
    )


def _split_or_one_device(
    hardware: Hardware,
    options: Options,
    data: DataFacts,
    model: ModelFacts,
    where: _Placement,
) -> _Placement:
    """`where`, or one device where data-parallel that kerascale chose on
    its own would not pay (`device_split.small_share`: a decision, no
    warning) or would fail where plain `fit` trains (`device_split.uneven`:
    dropped, with one warning)."""
    small = device_split.small_share(hardware, options, data, where)
    if small:
        return _by_default(
            hardware,
            where.policy,
            where.reasons["precision"],
            model,
            list(where.warnings),
            Reason("strategy.kept_one_device", why=small),
        )
    why = device_split.uneven(hardware, options, data, where, DEFAULT_BATCH_PER_REPLICA)
    if not why:
        return where
    return _on_one_device(
        hardware,
        where.strategy,
        where.policy,
        where.reasons["precision"],
        model,
        list(where.warnings),
        why=why,
        how=f"pass batches whose size is a multiple of {where.replicas}, of "
        "dense arrays",
    )


def _as_it_is(
    hardware: Hardware,
    choice: StrategyChoice,
    policy: str,
    why_policy: Reason,
    model: ModelFacts,
    warnings: list[str],
) -> _Placement:
    """The model as it is, for a plan that would re-create it but cannot: the
    choices that need a re-created model are dropped, and said so."""
    why = model.why_not_rebuildable
    needs_new_scope = (
        choice.scoped and choice.name != "default" and not model.in_strategy_scope
    )
    if needs_new_scope and choice.name == "multi_worker":
        # Training alone on each worker would silently diverge.
        raise ModelError(
            "Training on the cluster needs the model's variables in "
            "MultiWorkerMirroredStrategy's scope, and your model cannot be "
            f"re-created there ({why}). Pass a zero-argument function that "
            "builds and compiles it, or build it under "
            "`with kerascale.connect_cluster().scope():`."
        )
    warnings.append(
        f"Not applied: strategy {choice.name}, because the model cannot be "
        f"re-created in its scope ({why}): trained on one replica. To get it, "
        "pass a zero-argument function that builds and compiles the model "
        "instead of the model, or build it under the strategy's scope; to say "
        "you want it as it is, pass strategy='default'."
    )
    kept = Reason("strategy.kept_default", why=why)
    return _by_default(hardware, policy, why_policy, model, warnings, kept)


def _on_one_device(
    hardware: Hardware,
    dropped: str,
    policy: str,
    why_policy: Reason,
    model: ModelFacts,
    warnings: list[str],
    *,
    why: str = "",
    how: str = "",
) -> _Placement:
    """One device, for a JAX plan whose distribution could not lay the
    model's variables out (`model.unplaceable`), or (`why`) that the data
    cannot split: dropped, and said so."""
    why = why or model.unplaceable
    how = how or (
        "set keras.distribution.set_distribution(keras.distribution."
        "DataParallel()) before building the model"
    )
    warnings.append(
        f"Not applied: strategy {dropped}, because {why}: trained on one device, "
        f"as model.fit does. To get it, {how}; to say you want one device, pass "
        "strategy='default'."
    )
    kept = Reason("strategy.kept_one_device", why=why)
    return _by_default(hardware, policy, why_policy, model, warnings, kept)


def _by_default(
    hardware: Hardware,
    policy: str,
    why_policy: Reason,
    model: ModelFacts,
    warnings: list[str],
    kept: Reason,
) -> _Placement:
    """The default strategy, for the model as it is (`kept`: why)."""
    choice = strategy_rules.choose(hardware, "default")
    reasons = {
        "strategy": kept,
        "precision": why_policy,
        "rebuild": _as_it_is_reason(model, policy),
    }
    return _Placement(
        choice.name,
        tuple(choice.devices),
        choice.replicas,
        policy,
        model.builder,
        reasons,
        tuple(warnings),
    )


def _as_it_is_reason(model: ModelFacts, policy: str) -> Reason:
    if policy != model.policy and not model.builder:
        return Reason("rebuild.policy_in_place", old=model.policy, new=policy)
    return Reason("rebuild.matches")


def searched_batch(options: Options, data: DataFacts) -> bool:
    """Whether the batch itself is the search's answer (an "auto" batch for
    data that brings none); otherwise a search only bounds the micro-batch."""
    return options.batch_size == "auto" and not data.batched


def _rate(
    options: Options, data: DataFacts, effective: int
) -> tuple[float, dict[str, Reason]]:
    """What the batch does to the optimisation: the learning rate's factor,
    and the reasons for it and for the updates an epoch, where they say
    anything."""
    factor, why_lr = _lr_factor(options, data, effective)
    updates = accumulation_rules.updates_changed(options, data, effective)
    reasons = {"lr_factor": why_lr, "updates_per_epoch": updates}
    return factor, {k: why for k, why in reasons.items() if why is not None}


def _lr_factor(
    options: Options, data: DataFacts, effective: int
) -> tuple[float, Reason | None]:
    if options.lr_scaling is None:
        return 1.0, None
    base, where = options.base_batch_size, "base_batch_size"
    if base is None and data.batched and data.batch_size:
        base, where = data.batch_size, "your dataset's batch"
    if base is None:
        raise ConfigurationError(
            f"lr_scaling={options.lr_scaling!r} scales the learning rate from a base "
            "batch, and there is none here: pass base_batch_size= (the batch your "
            "learning rate was tuned for) or a batched dataset. Received: "
            "base_batch_size=None"
        )
    factor = accumulation_rules.lr_factor(options.lr_scaling, effective, base)
    rule = "B/base" if options.lr_scaling == "linear" else "sqrt(B/base)"
    return factor, Reason(
        "lr.scaled",
        scaling=options.lr_scaling,
        rule=rule,
        effective=effective,
        base=base,
        where=where,
        factor=factor,
    )


def _choose_batch(
    options: Options, data: DataFacts, replicas: int, search: SearchAnswer | None
) -> tuple[int, Reason]:
    if data.kind == "other":
        if options.batch_size != "auto":
            return options.batch_size, Reason("batch.passed_as_is")
        return 0, Reason("batch.unknown")
    if options.batch_size != "auto" and options.batch_chosen_by:
        batch = options.batch_size
        why = Reason("batch.chosen_by", who=options.batch_chosen_by)
    elif options.batch_size != "auto":
        batch, why = options.batch_size, Reason("batch.passed")
    elif data.batched and data.batch_size:
        batch, why = data.batch_size, Reason("batch.dataset")
    elif search is not None:
        batch = search.per_replica_batch_size * replicas
        how = "cached search" if search.cached else search.reasons.get("search", "")
        why = Reason("batch.searched", how=how, answer=search.reasons["batch_size"])
    else:
        batch = DEFAULT_BATCH_PER_REPLICA * replicas
        why = Reason("batch.keras_default", default=DEFAULT_BATCH_PER_REPLICA)
    if batch % replicas:
        raise ConfigurationError(
            f"batch_size must be divisible by the number of replicas ({replicas}) "
            f"so that every replica gets the same share. Received: "
            f"batch_size={batch}. Use a multiple of {replicas}, e.g. "
            f"{max(replicas, batch - batch % replicas)}."
        )
    return batch, why


def _within_data(
    batch: int, why: Reason, data: DataFacts, replicas: int, asked: bool
) -> tuple[int, Reason, list[str]]:
    """A batch no larger than a finite dataset: as Keras trains arrays with a
    batch_size above their length, one batch of all the samples per epoch
    (rounded down to a multiple of the replicas); said when it was asked."""
    n = data.num_samples
    if not n or batch <= n or data.kind == "pydataset":
        return batch, why, []
    capped = max(replicas, n - n % replicas)
    warnings = []
    if asked:
        data_is = (
            f"the {n} samples that train ({data.held_out} held back by "
            "validation_split)"
            if data.held_out
            else f"your data ({n} samples)"
        )
        warnings.append(
            f"batch_size={batch} is larger than {data_is}: training "
            f"with batches of {capped}, one optimizer update per epoch, as "
            "model.fit does. Pass a batch_size of at most the data's size to "
            "choose."
        )
    return capped, Reason("batch.capped", why=why, samples=n), warnings


def _split(
    hardware: Hardware, where: _Placement, data: DataFacts, step_batch: int
) -> tuple[dict[str, Any], list[str]]:
    """How each batch is split where the devices must divide it (JAX)."""
    if not backend_lib.traits(hardware.backend).even_batches:
        return {}, []
    processes = _processes(hardware, where)
    return batch_split.changes(data, step_batch, where.replicas, processes)


def _processes(hardware: Hardware, where: _Placement) -> int:
    """The JAX processes kerascale's own DataParallel spans (1 elsewhere)."""
    cluster = hardware.cluster
    joined = cluster is not None and cluster.source == jax_processes.JOINED
    return (
        cluster.num_workers
        if joined and where.strategy in ("data_parallel", "model_parallel")
        else 1
    )


def _data_changes(
    options: Options, data: DataFacts, global_batch: int, replicas: int, backend: str
) -> tuple[DataChanges, Reason]:
    changes, why = _pipeline_changes(options, data, global_batch, replicas)
    if backend_lib.traits(backend).reads_in_step_thread and options.optimize_data:
        # kerascale.callbacks.Prefetch, installed by kerascale.fit where a
        # callback of the run makes Keras wait for each step's logs.
        changes = dataclasses.replace(changes, read_ahead=True)
        why = Reason("data.read_ahead", optimize_data=options.optimize_data)
    return changes, why


def _pipeline_changes(
    options: Options, data: DataFacts, global_batch: int, replicas: int
) -> tuple[DataChanges, Reason]:
    if data.kind in ("arrays", "pydataset", "other"):
        return DataChanges(), Reason(f"data.{data.kind}")
    batching: dict[str, Any] = {}
    if not data.batched:
        batching = {"batch": global_batch}
    elif data.batch_size != global_batch:
        batching = {"batch": global_batch, "rebatch_from": data.batch_size}
    changes = DataChanges(**batching)
    if options.optimize_data:
        changes = dataclasses.replace(
            changes,
            parallel_map=data.sequential_map,
            prefetch=True,
            autotune_off=not data.autotune_set,
            cache=data.cacheable,
            # TF's AUTO tries files first and warns when it falls back to
            # data; saying which one applies is quieter and shows in the plan.
            shard=("file" if data.from_files else "data") if replicas > 1 else "",
        )
        what = "read ahead of training"
    else:
        what = "batched only" if batching else "as given"
    why = Reason("data.pipeline", what=what, optimize_data=options.optimize_data)
    return changes, why
