"""One path from (model, data, plan) to what trains, and the session that owns
every change made on the way.

Its design: docs/design/modules.md, `kerascale.apply.session`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import keras

from kerascale import _keras_compat as keras_compat
from kerascale._tf import tf
from kerascale.apply import accumulation, remat
from kerascale.apply import data as data_lib
from kerascale.apply import model as model_lib
from kerascale.apply import precision as precision_lib
from kerascale.apply import steps as steps_lib
from kerascale.apply import strategy as strategy_lib
from kerascale.apply.controller import Controller
from kerascale.apply.jax import cluster as jax_cluster
from kerascale.apply.jax import even_batches
from kerascale.apply.tensorflow import cluster
from kerascale.errors import ConfigurationError, warn
from kerascale.plan.fallback import FirstStepFailed
from kerascale.sense import backend as backend_lib
from kerascale.sense import data_facts
from kerascale.sense.model_facts import borrow_problem, gist, is_builder
from kerascale.sense.oom import is_oom_exception

if TYPE_CHECKING:
    from kerascale.plan.measured import SearchAnswer
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.hardware import Hardware
    from kerascale.sense.model_facts import ModelFacts

logger = logging.getLogger("kerascale")
T = TypeVar("T")


class Decision(Protocol):
    """What carrying a decision out reads of it (`measure.decided.Decided`,
    from the layer above)."""

    @property
    def plan(self) -> Plan: ...
    @property
    def data(self) -> DataFacts: ...
    @property
    def hardware(self) -> Hardware: ...
    @property
    def model(self) -> ModelFacts: ...
    @property
    def instance(self) -> Any: ...  # the user's strategy, or None
    @property
    def optimize_data(self) -> bool: ...
    @property
    def search(self) -> SearchAnswer | None: ...


class Session:
    """Owns the changes one training run (or one measurement) makes, and
    undoes each of them on every exit, newest first.

    During an exit by an exception, an undo that itself fails is reported
    with a warning and the original exception goes on: the user sees the
    error that stopped training, not one from cleaning up after it.

    Example:

    >>> with Session() as session:
    ...     prepared = prepare(session, model, x, None, decided)
    ...     history = train(prepared, verbose=1)
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Session:
        self._stack.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return self._stack.__exit__(exc_type, exc, tb)

    def undo(
        self, what: str, fn: Callable[..., Any], *args: Any, outcome: bool = False
    ) -> None:
        """Registers `fn(*args)`, which undoes `what`, to run on exit; with
        `outcome`, `fn(*args, ok)`, `ok` telling whether the session ended
        without an exception."""

        def run(exc_type, exc, tb) -> bool:
            try:
                fn(*args, exc_type is None) if outcome else fn(*args)
            except Exception as e:
                if exc_type is None:
                    raise
                warn(
                    f"kerascale could not undo {what} after training stopped "
                    f"with {exc_type.__name__}: {type(e).__name__}: {e}"
                )
            return False

        self._stack.push(run)

    def enter(self, context: contextlib.AbstractContextManager[T]) -> T:
        """Enters `context` (a context manager) for the session's lifetime."""
        return self._stack.enter_context(context)

    def model_for(
        self,
        model: Any,
        plan: Plan,
        *,
        instance: Any = None,
        copy: bool = False,
    ) -> tuple[keras.Model, Any]:
        """The model that trains under `plan`, and its strategy.

        The model is re-created under the strategy's scope when `plan.rebuild`
        says so (a multi-replica strategy whose scope the model's variables
        are not in), or when `copy` asks for a model that is not the user's
        (measurements must not train the user's weights). Without `copy`, a
        re-created model's weights go back into the user's model on exit. A
        copy that cannot be made of a model the plan keeps as it is is the
        model itself, borrowed: its variables are put back on exit.

        The plan's precision is then set in place on the model that trains
        (`kerascale.apply.precision`), and undone on exit.

        Raises:
            model.CannotRecreate: When the plan needs a re-created model and
                it cannot be made (the caller falls back).
        """
        dist = strategy_lib.build(plan, instance)
        self.enter(strategy_lib.activated(plan, dist))
        if is_builder(model):
            new = model_lib.recreate(model, plan.precision, dist)
            self._recompute(new, plan)
            if not copy:
                self._steps(new, plan, builder=True)
            return new, dist
        change = precision_lib.layers_to_change(model)
        new = model
        if plan.rebuild or copy:
            try:
                new = model_lib.recreate(model, plan.precision, dist)
            except model_lib.CannotRecreate:
                if plan.rebuild or not copy or borrow_problem(model):
                    raise
                new = self.enter(model_lib.borrow(model))
            else:
                if not copy:
                    self.undo(
                        "copying the trained weights back",
                        model_lib.copy_back,
                        new,
                        model,
                    )
        try:
            undo_placing = strategy_lib.place(plan, dist, new)
        except Exception as e:
            raise model_lib.CannotPlace(
                f"its variables could not be laid out over {plan.replicas} "
                f"devices ({type(e).__name__}: {gist(e)})"
            ) from e
        if undo_placing is not None:
            self.undo("the variables' layout for the run", undo_placing)
        reuse = (
            new is model
            and undo_placing is None  # traced for this run's placement only
            and plan.precision != "mixed_float16"
            and plan.accumulation_steps <= 1
            and plan.lr_factor == 1.0
            and not getattr(plan, "recompute", "")
        )
        undo = precision_lib.apply(new, plan.precision, change, reuse=reuse)
        self.undo(f"the {plan.precision} policy set on the model", undo, outcome=True)
        self._recompute(new, plan)
        if not copy:
            self._steps(new, plan)
        return new, dist

    def _steps(self, model: keras.Model, plan: Plan, *, builder: bool = False) -> None:
        """The plan's steps per call set on the model that trains (not on a
        measurement's copy, which times steps one a call), undone on exit."""
        n = getattr(plan, "steps_per_execution", 1)
        undo = steps_lib.apply(model, n, builder=builder)
        if undo is not None:
            self.undo(f"steps_per_execution={n} set on the model", undo, outcome=True)

    def _recompute(self, model: keras.Model, plan: Plan) -> None:
        """The plan's recomputation set on `model`'s layers, undone on exit."""
        mode = getattr(plan, "recompute", "")
        if mode:
            self.undo(f"recomputation ({mode}) on the layers", remat.apply(model, mode))

    def accumulate(self, model: keras.Model, plan: Plan, *, final: bool) -> None:
        """Gradient accumulation and learning-rate scaling as `plan` says, on
        `model`'s optimizer, undone on exit. `final`: the real run, whose end
        drops (and reports) a partial last window."""
        if plan.accumulation_steps <= 1 and plan.lr_factor == 1.0:
            return
        saved = accumulation.apply(model, plan.accumulation_steps, plan.lr_factor)
        if final:
            self.undo(
                "gradient accumulation",
                accumulation.finish,
                model,
                saved,
                plan.accumulation_steps,
                plan.global_batch_size,
            )
        else:
            self.undo("gradient accumulation", accumulation.restore, model, saved)


@dataclasses.dataclass
class Prepared:
    """What trains, as `prepare` set it up.

    Attributes:
        decided: The decision applied: the one given, or the fallback's.
        model: The model that trains (the user's, a re-created copy, or the
            builder's).
        strategy: Its `tf.distribute.Strategy`.
        plan: The plan applied (`decided.plan`, with what the cluster adds).
        x, y: The data as Keras gets it.
        fit_kwargs: `model.fit`'s other arguments, with the plan's batch for
            arrays and prepared validation data.
        quiet_end_of_data: Whether Keras's "input ran out of data" warning is
            the normal end of a re-batched epoch here.
    """

    decided: Decision
    model: keras.Model
    strategy: Any
    plan: Plan
    x: Any
    y: Any
    fit_kwargs: dict[str, Any]
    quiet_end_of_data: bool = False


def prepare(
    session: Session,
    model: Any,
    x: Any,
    y: Any,
    decided: Decision,
    *,
    copy: bool = False,
    as_dataset: bool = False,
    fit_kwargs: dict[str, Any] | None = None,
    read_in_part: bool = False,
) -> Prepared:
    """Sets up what trains under `decided.plan`, inside `session`.

    Args:
        session: Owns every change made here.
        model: The user's model or builder.
        x, y: The training data as the user gave it.
        decided: The decision: `.plan`, `.data` (`DataFacts`), `.instance`
            (the user's strategy, or None) and `.optimize_data`.
        copy: Train a copy (measurements): the user's model is not trained.
        as_dataset: Arrays become a batched, prefetched dataset (for
            measurements that iterate the data themselves).
        fit_kwargs: `model.fit`'s other arguments (not changed).
        read_in_part: The data is read for some steps of its first epoch
            only (`diagnose`'s rates): a dataset is then not cached, since
            TensorFlow throws a cache() read in part away, with a warning.

    Returns:
        `Prepared`.

    Raises:
        model.CannotRecreate: When re-creating the model, or laying it out
            over the devices, fails: the ladder's "recreate" rung.
    """
    train_model, dist = session.model_for(
        model, decided.plan, instance=decided.instance, copy=copy
    )
    if cluster.joined_by(dist):
        # Every worker takes the chief's TensorFlow seed for the run.
        session.undo("the cluster's shared seed", tf.random.set_seed, cluster.tf_seed())
    plan = cluster.start_alike(train_model, dist, decided.plan, decided.data, x)
    session.accumulate(train_model, plan, final=not copy)
    x, y, kwargs, quiet = _prepare_data(
        x, y, decided, plan, fit_kwargs, as_dataset, read_in_part=read_in_part
    )
    if backend_lib.traits(plan.backend).engine == "tf.distribute":
        # Keras skips a racy number of a generator's first batches under a
        # strategy of several replicas: read so that none is skipped.
        x = keras_compat.replayed(x, dist, kwargs)
    if decided.data.kind == "dataset" and plan.strategy in OWN_DISTRIBUTIONS:
        dist.auto_shard_dataset = True  # Keras shards a tf.data.Dataset itself
    return Prepared(decided, train_model, dist, plan, x, y, kwargs, quiet)


def _prepare_data(
    x: Any,
    y: Any,
    decided: Decision,
    plan: Plan,
    fit_kwargs: dict[str, Any] | None,
    as_dataset: bool,
    *,
    read_in_part: bool,
) -> tuple[Any, Any, dict[str, Any], bool]:
    kwargs = dict(fit_kwargs or {})
    kind, quiet = decided.data.kind, False
    if kind == "dataset":
        # Keras ignores shuffle for a dataset and warns when it is left True.
        kwargs.setdefault("shuffle", False)
        prepared = data_lib.prepare(
            x,
            decided.data,
            plan,
            optimize=decided.optimize_data,
            read_in_part=read_in_part,
        )
        quiet = "steps_per_epoch" not in kwargs and data_lib.lost_cardinality(
            x, prepared
        )
        x = prepared
    elif kind == "arrays" and as_dataset:
        ds = data_facts.as_structure(x if y is None else (x, y))
        ds = tf.data.Dataset.from_tensor_slices(ds)
        x, y = ds.batch(plan.step_batch_size).prefetch(tf.data.AUTOTUNE), None
    elif kind == "arrays" or (kind == "other" and plan.step_batch_size):
        kwargs["batch_size"] = plan.step_batch_size
    if backend_lib.traits(plan.backend).even_batches and not as_dataset:
        share = _share(plan)
        if share is not None and share.changes_anything:
            x, y, kwargs = even_batches.split_inputs(
                x, y, decided.data, share, plan.step_batch_size, kwargs
            )
    if "validation_data" in kwargs:
        kwargs["validation_data"], own = data_lib.prepare_validation(
            kwargs["validation_data"],
            plan,
            optimize=decided.optimize_data,
            validation_steps=kwargs.get("validation_steps"),
        )
        if (
            own
            and kwargs.get("validation_steps")
            and not kwargs.get("validation_batch_size")
        ):
            # Keras's validation_steps counts batches of the validation data
            # as given (or of batch_size); kerascale batches it per step.
            steps = kwargs["validation_steps"] * own / plan.step_batch_size
            kwargs["validation_steps"] = math.ceil(steps)
    if plan.accumulation_steps > 1 and kwargs.get("steps_per_epoch"):
        # Keras counts forward passes; steps_per_epoch means updates.
        kwargs["steps_per_epoch"] *= plan.accumulation_steps
    return x, y, kwargs, quiet


# The JAX distributions kerascale builds itself (a user's own is theirs).
OWN_DISTRIBUTIONS = ("data_parallel", "model_parallel")


def _share(plan: Plan) -> even_batches.Share | None:
    """How each global batch is split on JAX: over the plan's devices, and
    the processes of kerascale's own `DataParallel`. A distribution of
    yours over several processes gets your data as it is (Keras's own
    rules: a `tf.data.Dataset` it shards, or your `auto_shard_dataset`)."""
    processes, index = jax_cluster.processes()
    if plan.strategy in OWN_DISTRIBUTIONS:
        return even_batches.Share(plan.replicas, processes, index)
    return even_batches.Share(plan.replicas) if processes == 1 else None


class _StepWatch:
    """Knows whether a training step started and whether one completed, by
    two callbacks around Keras's step: one placed last, whose
    `on_train_batch_begin` runs right before the step, and one placed first,
    whose `on_train_batch_end` runs right after it. (Keras filters its own
    frames out of tracebacks, so the traceback cannot say where an error was
    raised.)"""

    def __init__(
        self,
        before_first: Callable[[], None] | None = None,
        after_first: Callable[[], None] | None = None,
    ) -> None:
        # Calls of the train function begun and done, and the steps done (a
        # call runs steps_per_execution of them: Keras's hooks get the first
        # step's index and the last's).
        self.started = self.done = self.steps = self.first_step = 0
        watch = self

        class Begin(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if not watch.started and before_first is not None:
                    before_first()
                watch.started += 1
                watch.first_step = batch

        class End(keras.callbacks.Callback):
            # Counting needs no step's logs: Keras may go on dispatching
            # steps (JAX) instead of waiting for each one's logs.
            async_safe = True

            def on_train_batch_end(self, batch, logs=None):
                watch.done += 1
                watch.steps += keras_compat.steps_of_call(
                    self.params, watch.first_step, batch
                )
                if watch.done == 1 and after_first is not None:
                    after_first()

        self.begin, self.end = Begin(), End()

    @property
    def failed_in_first_step(self) -> bool:
        return self.started == 1 and self.done == 0


def train(
    prepared: Prepared,
    *,
    verbose: Any,
    after_first_step: Callable[[], None] | None = None,
    controller: Controller | None = None,
    read_to_build: bool = False,
) -> keras.callbacks.History:
    """Keras's own `fit` on what `prepare` set up. A peer lost on a cluster
    becomes `WorkerLostError`; a failure inside the very first training step
    becomes `FirstStepFailed`; every other error is Keras's, unchanged.
    `after_first_step` runs once the first step is done. A `controller`
    runs `fit` in segments where its levers change a setting.
    `read_to_build`: Keras's `fit` would have read a batch to build the
    model when `fit` was called (`keras_compat.build_pending`)."""
    # Keras's JAX fit empties the model's variables while it trains, and
    # leaves them empty when it raises: they are put back here.
    guard = None
    traits = backend_lib.traits(prepared.plan.backend)
    if traits.empties_variables:
        guard = keras_compat.StateGuard(prepared.model)
    steps = _StepWatch(
        guard.before_first_step if guard is not None else None, after_first_step
    )
    kwargs = dict(prepared.fit_kwargs)
    callbacks = kwargs.get("callbacks") or []
    if controller is not None:
        callbacks = controller.wrapped(callbacks)
    kwargs["callbacks"] = [steps.end, *callbacks, steps.begin]
    # Where a step consumes its state (JAX donates it) and kerascale chose the
    # batch, the state is kept to go back to if the first step fails.
    restore = None
    if prepared.decided.search is not None:
        restore = strategy_lib.keep_state(prepared.plan, prepared.model)
    if traits.reads_to_build and data_lib.caches(prepared.x):
        # Keras's JAX fit reads one batch to build the loss and metrics, from
        # an iterator it drops: a cache() kerascale added would warn that it
        # discarded what that read began. Built from the element's spec.
        # A model that builds only at a real batch's size (keras-hub's
        # D-FINE with denoising concatenates a fixed batch of labels) is
        # left to Keras, which builds it from the batch it reads, as in
        # plain fit (TensorFlow may then log that the cache was not fully read).
        with contextlib.suppress(RuntimeError, ValueError, TypeError):
            keras_compat.build_like_first_step(prepared.model, prepared.x.element_spec)
    elif (
        traits.reads_to_build
        and read_to_build
        and not keras_compat.build_pending(prepared.model)
    ):
        # A measurement built the model (the JAX search compiles its step
        # for training to reuse): Keras now skips that read, which drew the
        # first epoch's order. Read as Keras would have (issue 80).
        read = keras_compat.ReadToBuild(prepared.model)
        begin = keras.callbacks.LambdaCallback(on_train_begin=lambda logs: read())
        kwargs["callbacks"] = [begin, *kwargs["callbacks"]]
    with warnings.catch_warnings():
        if prepared.quiet_end_of_data:
            warnings.filterwarnings("ignore", "Your input ran out of data")

        def fit(arguments: dict[str, Any]) -> keras.callbacks.History:
            return prepared.model.fit(
                prepared.x, prepared.y, verbose=verbose, **arguments
            )

        try:
            if controller is None:
                history = fit(kwargs)
            else:
                history = controller.run(
                    fit,
                    kwargs,
                    keep=guard.before_first_step if guard is not None else None,
                    recover=guard.recover if guard is not None else None,
                    model=prepared.model,
                )
        except Exception as e:
            recovered = guard is None or guard.recover()
            lost = cluster.translate_error(e)
            if lost is not None:
                raise lost from e
            if steps.failed_in_first_step:
                if not recovered and restore is not None:
                    restore()
                decided = prepared.decided
                raise FirstStepFailed(
                    e,
                    plan=decided.plan,
                    policy=decided.model.policy,
                    searched=decided.search is not None,
                    out_of_memory=is_oom_exception(e),
                    model_steps=decided.model.steps_per_execution,
                ) from e
            raise
    k = prepared.plan.accumulation_steps
    if k > 1 and history.epoch and steps.steps < k:
        raise ConfigurationError(
            f"Training made no optimizer update: it ran {steps.steps} "
            f"micro-batch(es) of {prepared.plan.micro_batch_size}, fewer than the "
            f"accumulation_steps={k} one update needs, so nothing was applied. "
            "Your data yields fewer batches than that: use a smaller "
            "batch_size, or more epochs or data."
        )
    return history
