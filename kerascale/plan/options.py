"""The user's requests, validated at the door (`Options`), and the "auto"
choices pinned to a resumed checkpoint's plan (`pin`)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from kerascale import _validation
from kerascale.errors import ConfigurationError
from kerascale.plan import precision as precision_rules
from kerascale.plan import strategy as strategy_rules
from kerascale.plan.model_sharding import Sharded
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason

VERBOSE_CHOICES = ("auto", 0, 1, 2)


# Who chose an int batch_size, where it is not the user (a tuner's trial):
# the batch's reason names it. Set with `batch_chosen_by`.
_BATCH_CHOSEN_BY: contextvars.ContextVar[str] = contextvars.ContextVar(
    "kerascale_batch_chosen_by", default=""
)


@contextlib.contextmanager
def batch_chosen_by(who: str) -> Iterator[None]:
    """Inside, an int `batch_size` given to a door is `who`'s choice, and
    the plan's batch reason says so (`kerascale.tuner`'s trials: "batch_size
    you passed" read as the user's own)."""
    token = _BATCH_CHOSEN_BY.set(who)
    try:
        yield
    finally:
        _BATCH_CHOSEN_BY.reset(token)


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
    remeasure: bool = False  # measure again instead of reading the cache
    # "auto" (weighed where the batch wanted does not fit), "activations"
    # (Keras's remat mode, always), or "off".
    recompute: str = "auto"
    # Who chose an int batch_size, where not the user (`batch_chosen_by`).
    batch_chosen_by: str = ""
    # Training steps per call into the compiled step (Keras's
    # `steps_per_execution`): "auto" (measured, `measure.host_path`) or an int.
    steps_per_execution: int | str = "auto"

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
        remeasure: Any = False,
        recompute: Any = "auto",
        steps_per_execution: Any = "auto",
    ) -> Options:
        """Checks every option at the door; raises `ConfigurationError`."""
        if batch_size != "auto" or isinstance(batch_size, bool):
            _validation.positive_int(
                "batch_size", batch_size, accepted='a positive int or "auto"'
            )
        strategy_rules.validate_request(strategy)
        _validation.one_of("precision", precision, precision_rules.CHOICES)
        _validation.boolean_or_auto("optimize_data", optimize_data)
        _validation.boolean("remeasure", remeasure)
        recompute = recompute_request(recompute)
        if steps_per_execution != "auto" or isinstance(steps_per_execution, bool):
            _validation.positive_int(
                "steps_per_execution",
                steps_per_execution,
                accepted="a positive int (training steps per call into the compiled "
                'step) or "auto"',
            )
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
            strategy=strategy_rules.resolve_request(strategy),
            precision=precision,
            optimize_data=optimize_data,
            verbose=verbose,
            accumulation_steps=accumulation_steps,
            lr_scaling=lr_scaling,
            base_batch_size=base_batch_size,
            max_batch_size=max_batch_size,
            remeasure=remeasure,
            recompute=recompute,
            batch_chosen_by=_BATCH_CHOSEN_BY.get() if batch_size != "auto" else "",
            steps_per_execution=steps_per_execution,
        )


def recompute_request(value: Any) -> str:
    """`recompute=` checked, as "auto", "activations" or "off"."""
    if value is True or value == "activations":
        return "activations"
    if value is False:
        return "off"
    if value == "auto" and not isinstance(value, bool):
        return "auto"
    raise _validation.fail(
        "recompute",
        value,
        '"auto" (weighed against accumulation where the batch does not fit), '
        'True or "activations" (always), or False (never)',
    )


def user_instance(options: Options) -> Any:
    """The strategy or distribution object you passed, or None (a name, or
    planning's own request to shard, `plan.model_sharding.Sharded`)."""
    strategy = options.strategy
    return None if isinstance(strategy, str | Sharded) else strategy


# Option -> the Plan reason it decides.
_PINNED_REASON = {
    "precision": "precision",
    "optimize_data": "data_changes",
    "batch_size": "global_batch_size",
    "accumulation_steps": "accumulation_steps",
    "recompute": "recompute",
}


def pin(
    options: Options, saved: Plan | None, *, data_batched: bool
) -> tuple[Options, list[str]]:
    """Options with the "auto" choices a checkpoint was written under, so a
    rerun resumes with them even if a new search or trial would differ; and
    the names of the options so set. `data_batched`: whether the data brings
    its own batch (then an "auto" batch is the data's, not the checkpoint's)."""
    if saved is None:
        return options, []
    changes: dict[str, Any] = {}
    if options.precision == "auto":
        changes["precision"] = saved.precision
    if options.optimize_data == "auto":
        changes["optimize_data"] = saved.data_changes.optimized
    if options.batch_size == "auto" and not data_batched:
        changes["batch_size"] = saved.global_batch_size
    batch = changes.get("batch_size", options.batch_size)
    if options.accumulation_steps is None and batch == saved.global_batch_size:
        changes["accumulation_steps"] = saved.accumulation_steps
    if options.recompute == "auto":
        changes["recompute"] = saved.recompute or "off"
    return dataclasses.replace(options, **changes), sorted(changes)


def pinned_reasons(pinned: list[str] | tuple[str, ...]) -> dict[str, Reason]:
    """The reasons of the choices that came from the checkpoint being
    resumed (not "you asked for it"), by plan field."""
    return {_PINNED_REASON[name]: Reason("resumed") for name in pinned}
