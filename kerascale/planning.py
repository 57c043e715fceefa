"""The Plan: every decision kerascale makes, decided once, before anything runs.

`make_plan` is a pure function of what is here (`Hardware`), what the user asked
for (`Options`) and facts about the model and data (`ModelFacts`, `DataFacts`).
It touches no TensorFlow state, so every rule is testable with a fake
`Hardware`. Applying the plan is the job of `strategy.build`,
`precision.rebuild` and `data.prepare`.
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from typing import Any

from kerascale import _validation
from kerascale import accumulation as accumulation_lib
from kerascale import precision as precision_lib
from kerascale import strategy as strategy_lib
from kerascale.errors import ConfigurationError, ModelError
from kerascale.hardware import Hardware
from kerascale.precision import ModelFacts

# Keras's own default when `fit` gets arrays and no batch size.
DEFAULT_BATCH_PER_REPLICA = 32

VERBOSE_CHOICES = ("auto", 0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Options:
    """The user's requests, validated. Build it with `Options.validate`."""

    batch_size: int | str = "auto"
    strategy: Any = "auto"  # a name, or a tf.distribute.Strategy instance
    precision: str = "auto"
    optimize_data: bool | str = "auto"
    verbose: int | str = "auto"
    accumulation_steps: int | None = None
    lr_scaling: str | None = None
    base_batch_size: int | None = None
    max_batch_size: int | None = None  # global; the largest batch per forward pass

    @classmethod
    def validate(
        cls,
        *,
        batch_size: Any = "auto",
        strategy: Any = "auto",
        precision: Any = "auto",
        optimize_data: Any = "auto",
        verbose: Any = "auto",
        accumulation_steps: Any = None,
        lr_scaling: Any = None,
        base_batch_size: Any = None,
        max_batch_size: Any = None,
    ) -> Options:
        """Checks every option at the door; raises `ConfigurationError`."""
        if batch_size != "auto" or isinstance(batch_size, bool):
            _validation.positive_int(
                "batch_size", batch_size, accepted='a positive int or "auto"'
            )
        strategy_lib.validate_request(strategy)
        _validation.one_of("precision", precision, precision_lib.CHOICES)
        _validation.boolean_or_auto("optimize_data", optimize_data)
        if isinstance(verbose, bool) or verbose not in VERBOSE_CHOICES:
            raise _validation.fail("verbose", verbose, '"auto", 0, 1 or 2')
        for name, value in (
            ("accumulation_steps", accumulation_steps),
            ("base_batch_size", base_batch_size),
            ("max_batch_size", max_batch_size),
        ):
            if value is not None:
                _validation.positive_int(name, value, accepted="a positive int or None")
        if lr_scaling is not None:
            _validation.one_of("lr_scaling", lr_scaling, ("linear", "sqrt"))
        if accumulation_steps and accumulation_steps > 1 and batch_size == "auto":
            raise ConfigurationError(
                "accumulation_steps needs the batch it adds up to: pass "
                "batch_size=<micro x replicas x accumulation_steps> as well (with "
                'batch_size="auto" the largest batch that fits needs no '
                f"accumulation). Received: accumulation_steps={accumulation_steps}, "
                'batch_size="auto"'
            )
        return cls(
            batch_size=batch_size,
            strategy=strategy,
            precision=precision,
            optimize_data=optimize_data,
            verbose=verbose,
            accumulation_steps=accumulation_steps,
            lr_scaling=lr_scaling,
            base_batch_size=base_batch_size,
            max_batch_size=max_batch_size,
        )


@dataclasses.dataclass(frozen=True)
class DataFacts:
    """What planning needs to know about the training data.

    Attributes:
        kind: "dataset", "pydataset" or "arrays".
        batched: Whether a dataset arrives already batched.
        batch_size: The batch of an already-batched dataset, else None.
        num_samples: Samples per epoch where known (arrays; datasets of known
            length, counting a batched one's last batch as full), else None.
        from_files: Whether a dataset reads files (TFRecord, text lines...),
            which lets a distributed strategy shard it by file.
        cacheable: Whether a dataset gives the same elements every epoch (no
            shuffle, no random or Python ops), has a known length, and fits
            in a quarter of the memory available: `cache()` then spares
            re-computing it.
    """

    kind: str
    batched: bool = False
    batch_size: int | None = None
    num_samples: int | None = None
    from_files: bool = False
    cacheable: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every decision for one training run, and why each was made.

    Attributes:
        strategy: The distribution strategy's name ("default", "one_device",
            "mirrored", "tpu", or the class name of a strategy you passed).
        devices: The devices that hold a replica.
        replicas: Model replicas trained in sync.
        precision: The Keras dtype policy name.
        micro_batch_size: Samples per replica per forward pass.
        accumulation_steps: Forward passes per optimizer update.
        global_batch_size: Samples per optimizer update, equal to
            `micro_batch_size * replicas * accumulation_steps`.
        lr_factor: The factor applied to the learning rate.
        rebuild: Whether the model is re-created under the policy and scope.
        data_changes: What kerascale changed in the input pipeline.
        hardware: A one-line summary of the hardware.
        reasons: Field name -> why it has its value.
        warnings: Things the user should know (e.g. mixed GPU types).
    """

    strategy: str
    devices: tuple[str, ...]
    replicas: int
    precision: str
    micro_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    lr_factor: float = 1.0
    rebuild: bool = False
    data_changes: tuple[str, ...] = ()
    hardware: str = ""
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def __post_init__(self):
        # Frozen means frozen: the reasons cannot be edited behind the plan's back.
        object.__setattr__(self, "reasons", types.MappingProxyType(dict(self.reasons)))
        expected = self.micro_batch_size * self.replicas * self.accumulation_steps
        if expected != self.global_batch_size:
            raise ConfigurationError(
                "global_batch_size must equal micro_batch_size * replicas * "
                f"accumulation_steps = {expected}. Received: "
                f"global_batch_size={self.global_batch_size}"
            )

    @property
    def step_batch_size(self) -> int:
        """Samples in one forward pass across replicas: the dataset's batch."""
        return self.micro_batch_size * self.replicas

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON; `Plan.from_json` reads it back."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigurationError(
                f"Unknown Plan field(s) {sorted(unknown)}; known: {sorted(names)}."
            )
        kwargs = dict(d)
        for key in ("devices", "data_changes", "warnings"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        rows = [
            ("hardware", self.hardware, ""),
            (
                "strategy",
                f"{self.strategy} ({self.replicas} replica"
                f"{'s' if self.replicas != 1 else ''})",
                self.reasons.get("strategy", ""),
            ),
            ("precision", self.precision, self.reasons.get("precision", "")),
            (
                "batch",
                f"{self.micro_batch_size} x {self.replicas} x "
                f"{self.accumulation_steps} = {self.global_batch_size}",
                "; ".join(
                    r
                    for r in (
                        self.reasons.get("global_batch_size", ""),
                        self.accumulation_steps > 1
                        and self.reasons.get("accumulation_steps", ""),
                    )
                    if r
                ),
            ),
        ]
        if self.lr_factor != 1.0:
            rows.append(
                ("lr factor", f"{self.lr_factor:g}", self.reasons.get("lr_factor", ""))
            )
        rows.append(
            (
                "model",
                "re-created" if self.rebuild else "used as is",
                self.reasons.get("rebuild", ""),
            )
        )
        rows.append(
            (
                "data",
                ", ".join(self.data_changes) or "unchanged",
                self.reasons.get("data_changes", ""),
            )
        )
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = ["kerascale plan (batch = micro x replicas x accumulation = global)"]
        for name, value, why in rows:
            line = f"  {name:<{w0}}  {value:<{w1}}"
            lines.append(f"{line}  {why}".rstrip() if why else line.rstrip())
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def make_plan(
    hardware: Hardware,
    options: Options,
    model: ModelFacts,
    data: DataFacts,
    *,
    search: Any = None,
) -> Plan:
    """Decides strategy, precision, batch and data handling. Pure.

    Args:
        hardware: What is here (`detect_hardware()` or a fake).
        options: The validated user options.
        model: Facts about the model.
        data: Facts about the training data.
        search: A `BatchSearchResult` for this plan's precision and strategy,
            which decides an "auto" batch.

    Returns:
        The `Plan`.

    Raises:
        ConfigurationError: If the options cannot be met here (e.g. a batch not
            divisible by the number of replicas).
        ClusterConfigError: For a malformed cluster description.
        UnsupportedError: For a cluster task that does not train.
    """
    reasons: dict[str, str] = {}
    warnings: list[str] = []

    choice = strategy_lib.choose(hardware, options.strategy)
    warnings += choice.warnings
    policy, why_policy, policy_warnings = precision_lib.choose(
        hardware, options.precision, model_policy=model.policy
    )
    warnings += policy_warnings

    strategy_name, devices, replicas = choice.name, choice.devices, choice.replicas
    why_strategy = choice.reason
    needs_new_scope = choice.name != "default" and not model.in_strategy_scope
    rebuild = model.builder or needs_new_scope or policy != model.policy
    why_rebuild = ""
    if rebuild and not model.rebuildable:
        # Fall back to what the model already is, and say what was not applied.
        dropped = []
        if policy != model.policy:
            dropped.append(f"precision {policy}")
            policy, why_policy = (
                model.policy,
                (f"kept the model's {model.policy}: {model.why_not_rebuildable}"),
            )
        if needs_new_scope and strategy_name == "multi_worker":
            # Training alone on each worker would silently diverge.
            raise ModelError(
                "Training on the cluster needs the model's variables in "
                "MultiWorkerMirroredStrategy's scope, and your model cannot be "
                f"re-created there ({model.why_not_rebuildable}). Pass a "
                "zero-argument function that builds and compiles it, or build "
                "it under `with kerascale.connect_cluster().scope():`."
            )
        if needs_new_scope:
            dropped.append(f"strategy {strategy_name}")
            fallback = strategy_lib.choose(hardware, "default")
            strategy_name, devices, replicas = (
                fallback.name,
                fallback.devices,
                fallback.replicas,
            )
            why_strategy = f"kept the default strategy: {model.why_not_rebuildable}"
        warnings.append(
            f"Not applied: {' and '.join(dropped)}, because the model cannot be "
            f"re-created ({model.why_not_rebuildable}). Pass a zero-argument "
            "function that builds and compiles the model instead of the model."
        )
        rebuild = False
    if model.builder:
        why_rebuild = "built by your function under the plan's policy and scope"
    elif rebuild:
        parts = []
        if policy != model.policy:
            parts.append(f"dtype policy {model.policy} -> {policy}")
        if needs_new_scope:
            parts.append(f"variables must live in the {strategy_name} scope")
        why_rebuild = "; ".join(parts) + "; weights copied, compile settings kept"
    else:
        why_rebuild = why_rebuild or "already matches the plan: zero overhead"
    reasons["strategy"] = why_strategy
    reasons["precision"] = why_policy
    reasons["rebuild"] = why_rebuild

    requested, why_batch = _choose_batch(options, data, replicas, search)
    sp, batch_warnings = _accumulation(options, data, requested, replicas, search)
    warnings += batch_warnings
    global_batch = sp.micro * replicas * sp.steps
    reasons["global_batch_size"] = why_batch
    reasons["accumulation_steps"] = sp.why
    factor, why_lr = _lr_factor(options, data, global_batch)
    if why_lr:
        reasons["lr_factor"] = why_lr
    data_changes, why_data = _data_changes(options, data, sp.micro * replicas, replicas)
    reasons["data_changes"] = why_data

    return Plan(
        strategy=strategy_name,
        devices=tuple(devices),
        replicas=replicas,
        precision=policy,
        micro_batch_size=sp.micro,
        accumulation_steps=sp.steps,
        global_batch_size=global_batch,
        lr_factor=factor,
        rebuild=rebuild,
        data_changes=tuple(data_changes),
        hardware=hardware.summary(),
        reasons=reasons,
        warnings=tuple(warnings),
    )


def searched_batch(options: Options, data: DataFacts) -> bool:
    """Whether the batch itself is the search's answer (an "auto" batch for
    data that brings none); otherwise a search only bounds the micro-batch."""
    return options.batch_size == "auto" and not data.batched


def _accumulation(
    options: Options, data: DataFacts, requested: int, replicas: int, search: Any
) -> tuple[accumulation_lib.Split, list[str]]:
    """How each replica reaches its share of `requested`: micro x k."""
    per_replica = requested // replicas
    k = options.accumulation_steps
    if k and k > 1 and data.kind == "pydataset":
        raise ConfigurationError(
            "accumulation_steps cannot split the batches of a keras.utils.PyDataset "
            "(it makes its own): make its batches the micro-batch and pass "
            "kerascale.accumulate(model, steps) with plain model.fit, or use a "
            f"tf.data.Dataset. Received: accumulation_steps={k}"
        )
    if k:
        if per_replica % k:
            raise ConfigurationError(
                f"accumulation_steps must divide the batch per replica "
                f"({requested} / {replicas} replicas = {per_replica}) into equal "
                f"micro-batches. Received: accumulation_steps={k}. Use a divisor of "
                f"{per_replica}, or a batch_size divisible by {k * replicas}."
            )
        why = f"accumulation_steps={k} you passed" if k > 1 else "accumulation_steps=1"
        return accumulation_lib.Split(per_replica // k, k, True, why), []
    bound, source = None, ""
    if options.max_batch_size:
        bound, source = max(1, options.max_batch_size // replicas), "max_batch_size"
    if search is not None and not searched_batch(options, data):
        measured = search.batch_size
        if bound is None or measured < bound:
            bound, source = measured, "measured"
    sp = accumulation_lib.split(per_replica, bound)
    if sp.steps > 1:
        sp = dataclasses.replace(sp, why=f"{sp.why} ({source} bound)")
    warnings = []
    if not sp.exact:
        below, above = accumulation_lib.nearest_exact(per_replica, bound, replicas)
        effective = sp.micro * replicas * sp.steps
        warnings.append(
            f"batch_size={requested} cannot be reached exactly: at most {bound} "
            f"samples per replica fit in one forward pass and {per_replica} has no "
            f"split into equal micro-batches that uses them well. Training with "
            f"{sp.micro} x {replicas} x {sp.steps} = {effective} samples per update "
            f"instead ({requested - effective} fewer). For exactly what you ask, "
            f"pass batch_size={below}"
            + (f" or {above}" if above != below else "")
            + f", or accumulation_steps= a divisor of {per_replica}."
        )
    return sp, warnings


def _lr_factor(options: Options, data: DataFacts, effective: int) -> tuple[float, str]:
    if options.lr_scaling is None:
        return 1.0, ""
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
    factor = accumulation_lib.lr_factor(options.lr_scaling, effective, base)
    rule = "B/base" if options.lr_scaling == "linear" else "sqrt(B/base)"
    return factor, (
        f"lr_scaling={options.lr_scaling!r}: {rule} = {effective}/{base} ({where}) "
        f"-> x{factor:g}"
    )


def _choose_batch(
    options: Options, data: DataFacts, replicas: int, search: Any
) -> tuple[int, str]:
    if data.kind == "pydataset" and options.batch_size not in ("auto", data.batch_size):
        raise ConfigurationError(
            f"batch_size cannot re-batch a keras.utils.PyDataset: it makes its own "
            f"batches of {data.batch_size}. Change the PyDataset's batch size, or "
            f'pass batch_size="auto". Received: batch_size={options.batch_size}'
        )
    if options.batch_size != "auto":
        batch, why = options.batch_size, "batch_size you passed"
    elif data.batched and data.batch_size:
        batch, why = data.batch_size, "the batch size of your batched dataset"
    elif search is not None:
        batch = search.batch_size * replicas
        how = "cached search" if search.cached else search.reasons.get("search", "")
        why = f"searched ({how}): {search.reasons['batch_size']}"
    else:
        batch = DEFAULT_BATCH_PER_REPLICA * replicas
        why = (
            f"data not batched and no batch_size given: Keras's default "
            f"{DEFAULT_BATCH_PER_REPLICA} per replica"
        )
    if batch % replicas:
        raise ConfigurationError(
            f"batch_size must be divisible by the number of replicas ({replicas}) "
            f"so that every replica gets the same share. Received: "
            f"batch_size={batch}. Use a multiple of {replicas}, e.g. "
            f"{max(replicas, batch - batch % replicas)}."
        )
    return batch, why


def _data_changes(
    options: Options, data: DataFacts, global_batch: int, replicas: int
) -> tuple[list[str], str]:
    if data.kind == "arrays":
        return [], "arrays are batched and prefetched by Keras itself"
    if data.kind == "pydataset":
        return [], "a PyDataset makes its own batches; Keras reads it"
    changes = []
    if not data.batched:
        changes.append(f"batch({global_batch})")
    elif data.batch_size != global_batch:
        changes.append(f"rebatch({data.batch_size} -> {global_batch})")
    if options.optimize_data:
        changes += ["map parallelization", "prefetch(AUTOTUNE)"]
        if data.cacheable:
            changes.append("cache()")
        if replicas > 1:
            # TF's AUTO tries files first and warns when it falls back to data;
            # saying which one applies is quieter and shows in the plan.
            changes.append(
                "shard by file (by data if fewer files than workers)"
                if data.from_files
                else "shard by data"
            )
    why = f"optimize_data={options.optimize_data!r}"
    return changes, why
