"""The front doors `kerascale.fit` and `kerascale.plan`: wiring only.

Both take the same path to a decision: the arguments are checked at the door,
the hardware is sensed, a cluster joined where the environment describes one,
a resumed checkpoint's choices pinned, and the plan decided (measured where a
rule can be wrong). `plan` returns it; `fit` applies it on the one path
(`kerascale.apply.session`), inside a session that owns every change made on
the way and undoes it however training ends, and hands over to Keras's own
`model.fit`. No decision is made here.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

import keras

from kerascale import _fit_arguments as door_words
from kerascale import _keras_compat as keras_compat
from kerascale import _validation
from kerascale._fit_docs import documented as _documented
from kerascale.apply import batch_growth
from kerascale.apply import levers as levers_lib
from kerascale.apply import materialize as materialize_lib
from kerascale.apply import session as session_lib
from kerascale.apply.tensorflow import cluster
from kerascale.callbacks import fit_callbacks
from kerascale.callbacks._base import KerascaleCallback
from kerascale.callbacks._input_source import InputSource
from kerascale.callbacks.backup import FaultTolerantBackup
from kerascale.callbacks.throughput import Throughput
from kerascale.errors import DataError, first_line, warn
from kerascale.measure.decide import Decided, decide, validate_options
from kerascale.measure.request import SearchOptions
from kerascale.measure.stages import Call
from kerascale.plan import fallback
from kerascale.plan.options import Options, pin
from kerascale.plan.plan import Plan
from kerascale.sense import backend as backend_lib
from kerascale.sense import data_facts, first_batch
from kerascale.sense import hardware as hardware_lib
from kerascale.sense.model_facts import is_builder

logger = logging.getLogger("kerascale")

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


@_documented
def fit(
    model: ModelOrBuilder,
    x: Any = None,
    y: Any = None,
    *,
    batch_size: int | str = "auto",
    strategy: Any = "auto",
    precision: str = "auto",
    max_batch_size: int | None = None,
    memory_limit: int | str | None = None,
    device_memory: int | str | None = None,
    accumulation_steps: int | None = None,
    lr_scaling: str | None = None,
    base_batch_size: int | None = None,
    optimize_data: bool | str = "auto",
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_freq: int | str = "epoch",
    start_over: bool = False,
    log_dir: str | os.PathLike | None = None,
    profile: bool | tuple[int, int] = False,
    time_budget: float | str | None = None,
    worker_timeout: float | str | None = None,
    recompute: bool | str = "auto",
    steps_per_execution: int | str = "auto",
    materialize: str | os.PathLike | None = None,
    remeasure: bool = False,
    verbose: int | str = "auto",
    **fit_kwargs: Any,
) -> keras.callbacks.History:
    """Trains `model` at the scale of the hardware here; `model.fit`'s drop-in.

    kerascale picks the distribution strategy and the fastest safe precision,
    sets the precision in place on your model (put back when `fit` ends),
    re-creates the model only where a multi-replica strategy needs its
    variables in its scope (weights, optimizer state and compile settings
    kept), batches the data, and calls Keras's own `fit`. Data it cannot read
    without consuming it (a generator, a grain loader) goes to Keras as it
    is. Your `model` then holds the trained weights, however training ended.
    Each decision is printed (unless `verbose=0`) and is in `history.plan`.

    Args:
        {arguments}

    Returns:
        Keras's `History`, with `history.plan` the `Plan` that was applied.

    Raises:
        ConfigurationError: For an invalid argument (the message names it).
        DataError: For data that cannot train (empty, infinite, mismatched).
        ModelError: For a model that is not compiled or cannot be built.
        ClusterConfigError: For a malformed cluster description.
        WorkerLostError: When another worker of the cluster dies.

    Example:

    >>> history = kerascale.fit(model, ds, epochs=2)
    >>> print(history.plan)
    """
    # The options are this signature's parameters, taken by name from
    # `locals()`: `fit`'s signature is their one declaration (`_FIT_OPTIONS`).
    refused, request = _at_door("kerascale.fit", model, x, locals())
    if refused is not None:
        raise refused  # here: the traceback is the user's line, then this
    if not backend_lib.supported():
        return _plain_fit(model, x, y, request, fit_kwargs)
    # A generator's first batch tells its size (and is given back first):
    # training reads it anyway, where `plan` must leave it unread.
    x = first_batch.first_read(x)
    try:
        return _attempted(_deciding(model, x, y, request, fit_kwargs))
    except door_words.USERS as e:
        if door_words.raised_in_keras(e):
            raise
        owner = door_words.own_fit(model)
        if isinstance(e, DataError) and owner:
            # Its own fit keeps its own checks, and its own errors.
            why = (
                f"kerascale.fit cannot plan for this data ({first_line(e)}), "
                f"and {owner} has its own fit: it trains as model.fit(...) "
                "would, without kerascale's plan."
            )
            return _plain_fit(model, x, y, request, fit_kwargs, why=why)
        raise e.with_traceback(None) from None  # the user's line, then this


def _attempted(deciding: _Deciding) -> keras.callbacks.History:
    """Decides and trains each attempt of the ladder (`plan.fallback`), from
    the first, until one trains."""

    def attempt(this: fallback.Attempt) -> keras.callbacks.History:
        decided = deciding.decide(this)
        try:
            return _train(deciding, decided, this)
        except fallback.FirstStepFailed:
            # A generator yields again what the failed attempt read of it.
            deciding.x = first_batch.replay(deciding.x)
            raise

    return fallback.attempted(attempt, deciding.options)


def _plain_fit(
    model: Any,
    x: Any,
    y: Any,
    request: _Request,
    fit_kwargs: dict,
    *,
    why: str | None = None,
) -> keras.callbacks.History:
    """`model.fit` as the user would call it, after one warning: `why`, or
    on a backend kerascale does not plan for, the options it ignored."""
    warn(
        why or backend_lib.unsupported_warning(backend_lib.name(), list(request.given))
    )
    kwargs = dict(fit_kwargs)
    if isinstance(request.options.batch_size, int):
        kwargs["batch_size"] = request.options.batch_size
    trained = model() if is_builder(model) else model
    history = trained.fit(x, y, verbose=request.options.verbose, **kwargs)
    history.plan = None
    return history


def _train(
    deciding: _Deciding, decided: Decided, attempt: fallback.Attempt
) -> keras.callbacks.History:
    """Applies `decided` on the one path, in a session that owns every
    change, and trains with Keras's own `fit`. Of the plan's warnings, those
    an earlier attempt gave are not given again, and those the attempt holds
    (`Attempt.held`) are given once the first step has run."""
    model, request = deciding.model, deciding.request
    said = attempt.said or ()
    held = attempt.held(decided.plan.warnings)
    with session_lib.Session() as session:
        prepared = session_lib.prepare(
            session,
            model,
            deciding.x,
            deciding.y,
            decided,
            fit_kwargs=deciding.fit_kwargs,
        )
        _install_callbacks(
            session, prepared, request.monitor, deciding.backup, deciding.x
        )
        levers = _levers(deciding, decided, prepared)
        plan, why = prepared.plan, levers.batch_why
        if why:
            plan = dataclasses.replace(
                plan, reasons={**plan.reasons, "batch_growth": why}
            )
        if request.options.verbose != 0:
            # verbose=2 (one line per epoch): every reason in full.
            full = request.options.verbose == 2
            print(plan.describe(warnings=False, full=full), flush=True)
        for w in plan.warnings:
            if w not in held and w not in said:
                warn(w)

        def after_first_step() -> None:
            first_batch.settle(deciding.x)
            for w in held:
                warn(w)

        history = session_lib.train(
            prepared,
            verbose=request.options.verbose,
            after_first_step=after_first_step,
            controller=levers.controller,
            read_to_build=deciding.reads_to_build,
        )
    if not is_builder(model):
        history.set_model(model)
    history.plan = levers.chosen(plan)  # the steps per call the run chose
    return history


@_documented
def plan(model: ModelOrBuilder, x: Any = None, y: Any = None, **kwargs: Any) -> Plan:
    """Returns the `Plan` that `fit` would apply, without training.

    It decides exactly as `fit` does, on a cluster too (every worker calls
    it, and they agree). Your model is not trained or changed (an unbuilt
    model is built symbolically from the data's shapes, as Keras's `fit`
    builds it: its `call` runs on no values); only the batch-size search's
    probes and, on a CPU, the trials of the choices left to kerascale train
    copies of it, or the model itself with every variable put back (both
    cached).

    Args:
        {arguments}

    Returns:
        The `Plan`.

    Raises:
        ConfigurationError: For an invalid argument (the message names it).
        DataError: For data that cannot train (empty, infinite, mismatched).
        ModelError: For a model that is not compiled or cannot be built.
        ClusterConfigError: For a malformed cluster description.

    Example:

    >>> p = kerascale.plan(model, ds)
    >>> p.precision, p.global_batch_size
    """
    arguments = {name: kwargs.pop(name, _DEFAULTS[name]) for name in _FIT_OPTIONS}
    refused, request = _at_door(
        "kerascale.plan", model, x, {**arguments, "fit_kwargs": kwargs}
    )
    if refused is not None:
        raise refused  # here: the traceback is the user's line, then this
    fit_kwargs = kwargs
    try:
        deciding = _deciding(model, x, y, request, dict(fit_kwargs), write=False)
        decided = fallback.attempted(deciding.decide, deciding.options)
    except door_words.USERS as e:
        if door_words.raised_in_keras(e):
            raise
        raise e.with_traceback(None) from None  # the user's line, then this
    for w in decided.plan.warnings:
        warn(w)
    why = batch_growth.reason(
        _growth_facts(deciding, decided, model, deciding.fit_kwargs)
    )
    if why is None:
        return decided.plan
    reasons = {**decided.plan.reasons, "batch_growth": why}
    return dataclasses.replace(decided.plan, reasons=reasons)


def _levers(
    deciding: _Deciding, decided: Decided, prepared: session_lib.Prepared
) -> levers_lib.Levers:
    """The run's levers and their controller (`apply.levers`)."""
    return levers_lib.assembled(
        _growth_facts(deciding, decided, prepared.model, prepared.fit_kwargs),
        deciding.x,
        deciding.y,
        prepared.plan,
        decided.steps_in_run,
        say=None if deciding.options.verbose == 0 else print,
        counters=tuple(
            c
            for c in prepared.fit_kwargs.get("callbacks") or ()
            if isinstance(c, Throughput)
        ),
        arguments=prepared.fit_kwargs,
    )


def _growth_facts(
    deciding: _Deciding, decided: Decided, model: Any, fit_kwargs: dict[str, Any]
) -> batch_growth.Facts:
    return batch_growth.Facts(
        model=model,
        # Yours: "auto" also where a checkpoint's plan pinned the batch.
        batch_size=deciding.request.options.batch_size,
        max_batch_size=deciding.options.max_batch_size,
        data=decided.data,
        hardware=decided.hardware,
        plan=decided.plan,
        clustered=bool(deciding.clustered),
        fit_kwargs=fit_kwargs,
        backup=deciding.backup,
    )


def _install_callbacks(
    session: session_lib.Session,
    prepared: session_lib.Prepared,
    monitor: fit_callbacks.Monitoring,
    backup: FaultTolerantBackup | None,
    x: Any,
) -> None:
    """Adds the callbacks `fit`'s arguments ask for, and gives the session
    every kerascale callback of the run to release on exit (Keras skips
    `on_train_end` when `fit` raises)."""
    plan = prepared.plan
    if backup is not None:
        backup.plan = plan
        host = backend_lib.traits(plan.backend).reads_in_step_thread
        backup.input_source = InputSource(x, host_iterated=host)

        def forget(source: InputSource = backup.input_source) -> None:
            source.release()
            backup.input_source = None

        session.undo("following the input across epochs", forget)
    callbacks = [
        *(prepared.fit_kwargs.get("callbacks") or []),
        *fit_callbacks.monitors(
            monitor,
            samples_per_step=plan.step_batch_size or None,
            gpus=len(prepared.decided.hardware.gpus),
            backup=backup,
        ),
    ]
    # The loader first, so that it reads under every other wrapper of the
    # step (a FaultTolerantBackup's finds the input where the step left it).
    callbacks = [*fit_callbacks.loader(plan, callbacks), *callbacks]
    prepared.fit_kwargs["callbacks"] = callbacks
    for callback in callbacks:
        if isinstance(callback, KerascaleCallback):
            what = f"what {type(callback).__name__} installed"
            session.undo(what, callback.release)


@dataclasses.dataclass(frozen=True)
class _Request:
    """`fit`'s and `plan`'s arguments, checked at the door."""

    options: Options
    search: SearchOptions
    monitor: fit_callbacks.Monitoring
    checkpoint_dir: str | os.PathLike | None
    checkpoint_freq: str | int
    worker_timeout: float | str | None
    materialize: str | os.PathLike | None = None
    start_over: bool = False
    # The options given other than at their defaults, as "name=value" (for
    # the warning on a backend kerascale does not plan for).
    given: tuple[str, ...] = ()

    @classmethod
    def validate(
        cls,
        *,
        log_dir: Any,
        profile: Any,
        time_budget: Any,
        checkpoint_dir: Any,
        checkpoint_freq: Any,
        start_over: Any,
        worker_timeout: Any,
        materialize: Any,
        **options: Any,
    ) -> _Request:
        """From `fit`'s and `plan`'s arguments (but the model and data),
        each by its name."""
        named = dict(
            options,
            log_dir=log_dir,
            profile=profile,
            time_budget=time_budget,
            checkpoint_dir=checkpoint_dir,
            checkpoint_freq=checkpoint_freq,
            start_over=start_over,
            worker_timeout=worker_timeout,
            materialize=materialize,
        )
        given = tuple(
            f"{name}={value!r}"
            for name, value in named.items()
            if name not in ("batch_size", "verbose") and value != _DEFAULTS[name]
        )
        checked, search = validate_options(**options)
        monitor = fit_callbacks.validate_fit_options(log_dir, profile, time_budget)
        fit_callbacks.validate_checkpointing(checkpoint_freq, start_over)
        if worker_timeout is not None:
            cluster.validate_timeout(worker_timeout)
        if materialize is not None and (
            not isinstance(materialize, str | os.PathLike) or not str(materialize)
        ):
            raise _validation.fail("materialize", materialize, "None or a folder path")
        return cls(
            checked,
            search,
            monitor,
            checkpoint_dir,
            checkpoint_freq,
            worker_timeout,
            materialize,
            start_over,
            given,
        )


@dataclasses.dataclass
class _Deciding:
    """What `fit`'s decision starts from, shared by `plan` (`_deciding`
    gathers it): the input (materialized where asked), the hardware, whether
    a cluster was joined, the run's backup and the options a resumed
    checkpoint pins; `decide` then decides, again for each attempt of the
    ladder. Its fields are set by name: making one does nothing else."""

    model: Any
    x: Any
    y: Any
    request: _Request
    fit_kwargs: dict
    materialized: Any
    # Whether Keras's fit would read a batch to build the model, before a
    # measurement builds it (`session.train` then reads as Keras would).
    reads_to_build: bool
    hardware: Any
    clustered: bool
    backup: FaultTolerantBackup | None
    options: Options
    pinned: list

    def decide(self, attempt: fallback.Attempt) -> Decided:
        """The decision of one attempt of the ladder."""
        search = self.request.search
        if self.backup is not None and self.backup.async_save:
            # Its saves hold a host copy of the state beside the steps.
            search = dataclasses.replace(search, state_copy=True)
        if attempt.options.max_batch_size != self.options.max_batch_size:
            # A rung bounded the batch (below one that ran out of memory).
            search = dataclasses.replace(
                search, max_batch_size=attempt.options.max_batch_size
            )
        call = Call(
            epochs=_epochs(self.fit_kwargs),
            steps_per_epoch=self.fit_kwargs.get("steps_per_epoch"),
            validation_split=self.fit_kwargs.get("validation_split"),
            steps_limit=fit_callbacks.steps_limit(
                self.fit_kwargs.get("callbacks"), self.request.monitor, self.x
            ),
            clustered=self.clustered,
            attempt=attempt,
            pinned=tuple(self.pinned),
            materialized=self.materialized,
        )
        return decide(
            self.model,
            self.x,
            self.y,
            attempt.options,
            call=call,
            search=search,
            hardware=self.hardware,
        )


def _deciding(
    model: Any,
    x: Any,
    y: Any,
    request: _Request,
    fit_kwargs: dict,
    *,
    write: bool = True,
) -> _Deciding:
    """The door's steps before a decision, in order, each named: the input
    materialized (written where `write`), the hardware sensed, the cluster
    joined (before anything else runs TensorFlow), the backup made (added
    to `fit_kwargs["callbacks"]`; it reads its directory) and the data
    inspected for the options a resumed checkpoint pins."""
    x, materialized, why_not = materialize_lib.materialized_input(
        x, request.materialize, write=write
    )
    if why_not:
        warn(why_not)
    reads_to_build = not is_builder(model) and keras_compat.build_pending(model)
    hardware = hardware_lib.detect_hardware()
    clustered = cluster.join_if_wanted(
        hardware, request.options.strategy, request.worker_timeout
    )
    backup = fit_callbacks.backup_for(
        request.checkpoint_dir,
        request.checkpoint_freq,
        fit_kwargs,
        request.options.verbose,
        start_over=request.start_over,
    )
    options, pinned = request.options, []
    if backup is not None:
        steps = fit_kwargs.get("steps_per_epoch")
        batched = data_facts.inspect(x, y, steps_per_epoch=steps).batched
        options, pinned = pin(options, backup.saved_plan(), data_batched=batched)
    return _Deciding(
        model,
        x,
        y,
        request,
        fit_kwargs,
        materialized,
        reads_to_build,
        hardware,
        clustered,
        backup,
        options,
        pinned,
    )


def _at_door(
    door: str, model: Any, x: Any, arguments: dict[str, Any]
) -> tuple[TypeError | None, _Request | None]:
    """The door's checks of its call, `arguments` being its parameters by
    name (`fit`'s signature, with `fit_kwargs`): a keyword or count Keras's
    `fit` would refuse (returned for the door to raise from its own frame),
    then Keras's batch for None or 0, then each option (`_Request`)."""
    fit_kwargs = arguments["fit_kwargs"]
    refused = door_words.refused(model, fit_kwargs, door=door, own=_FIT_OPTIONS)
    if refused is not None:
        return refused, None
    options = {name: arguments[name] for name in _FIT_OPTIONS}
    options["batch_size"] = door_words.batch_size(options["batch_size"], x, fit_kwargs)
    return None, _Request.validate(**options)


def _epochs(fit_kwargs: dict[str, Any]) -> int:
    """The epochs `model.fit` will train with these arguments (Keras's
    defaults: epochs=1, initial_epoch=0), for the trials' budget."""
    epochs, initial = fit_kwargs.get("epochs", 1), fit_kwargs.get("initial_epoch", 0)
    if isinstance(epochs, int) and isinstance(initial, int):
        return max(0, epochs - initial)
    return 1  # Keras will reject the value itself


# `fit`'s own options, its keyword-only parameters: their one declaration is
# `fit`'s signature, which `plan` takes as its own, and a misspelt keyword's
# nearest name may be one of them.
_FIT_OPTIONS = tuple(
    p.name
    for p in inspect.signature(fit).parameters.values()
    if p.kind is p.KEYWORD_ONLY
)
_DEFAULTS = {
    name: inspect.signature(fit).parameters[name].default for name in _FIT_OPTIONS
}
plan.__signature__ = inspect.signature(fit).replace(return_annotation="Plan")
