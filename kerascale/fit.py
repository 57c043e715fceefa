"""The front door: `kerascale.fit` and `kerascale.plan`.

This module only wires the capabilities together: detect the hardware, make the
plan, build the strategy, re-create the model where the plan says so, shape the
data, and hand over to Keras's own `model.fit`. No decision is made here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import keras

from kerascale import accumulation as accumulation_lib
from kerascale import data as data_lib
from kerascale import hardware as hardware_lib
from kerascale import monitoring, multiworker, resume
from kerascale import precision as precision_lib
from kerascale import strategy as strategy_lib
from kerascale.batch_search import SearchOptions
from kerascale.decide import AUTO_MIN_STEPS, agree, decide
from kerascale.errors import ModelError
from kerascale.planning import Options, Plan

logger = logging.getLogger("kerascale")

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


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
    accumulation_steps: int | None = None,
    lr_scaling: str | None = None,
    base_batch_size: int | None = None,
    optimize_data: bool | str = "auto",
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_freq: int | str = "epoch",
    log_dir: str | os.PathLike | None = None,
    profile: bool | tuple[int, int] = False,
    time_budget: float | str | None = None,
    worker_timeout: float | str | None = None,
    verbose: int | str = "auto",
    **fit_kwargs: Any,
) -> keras.callbacks.History:
    """Trains `model` at the scale of the hardware here; `model.fit`'s drop-in.

    kerascale detects the hardware, picks the distribution strategy and the
    fastest safe precision, re-creates the model under them where needed
    (weights, optimizer state and compile settings kept), batches or re-batches
    the data, and calls Keras's own `fit`. Afterwards your `model` holds the
    trained weights, so `model.predict` and `model.save` work as usual. Every
    decision is printed (unless `verbose=0`) and available as `history.plan`.

    Args:
        model: A compiled Keras model, or a zero-argument function that builds
            and compiles one (for subclassed models that cannot be cloned).
        x: A `tf.data.Dataset` (batched or not) yielding `(inputs, targets)`,
            or input arrays.
        y: Target arrays when `x` is arrays; None for a dataset.
        batch_size: Samples per optimizer update (Keras's meaning). "auto":
            your batched dataset's batch size; for unbatched data, the batch
            that the batch-size search finds for this hardware (the largest
            that fits on accelerators, the fastest on CPU; cached, see
            `find_batch_size`). Defaults to "auto".
        strategy: "auto", "default", "one_device", "mirrored",
            "multi_worker", "tpu", or a `tf.distribute.Strategy`. "auto"
            trains across the cluster that TF_CONFIG, Vertex AI's
            CLUSTER_SPEC or SLURM describes (`MultiWorkerMirroredStrategy`;
            call `kerascale.connect_cluster()` first in the script), else on
            this machine's devices. Defaults to "auto".
        precision: "auto", "float32", "mixed_float16" or "mixed_bfloat16".
            Defaults to "auto".
            An int larger than what fits in memory is reached with gradient
            accumulation: micro x replicas x accumulation_steps = batch_size.
        max_batch_size: The largest batch (all replicas) to put through the
            model in one forward pass: it caps the search, and a larger
            `batch_size` is split into micro-batches of at most this size.
            Defaults to `None`: measured where memory is tight (GPUs, TPUs,
            or with `memory_limit`), else no bound.
        memory_limit: Memory training must fit in: bytes or "6GiB" (per GPU
            on GPUs; the process's data memory on CPU). Defaults to `None`:
            the GPU's memory, or 80% of the memory available on CPU.
        accumulation_steps: Micro-batches per optimizer update, to state the
            split yourself (`batch_size` must then be divisible by it times
            the replicas). Defaults to `None`: chosen from what fits.
        lr_scaling: None, "linear" or "sqrt": scale the learning rate (a
            float or a schedule) by B/base or sqrt(B/base) when the batch B
            per update differs from the base batch. Defaults to `None`.
        base_batch_size: The batch your learning rate was tuned for, for
            `lr_scaling`. Defaults to `None`: a batched dataset's batch.
        optimize_data: Add prefetching and map parallelisation to a dataset.
            "auto": yes, except on a CPU where a one-second trial of each
            finds the pipeline as given faster (cached). Defaults to "auto".
        checkpoint_dir: Where to keep fault-tolerant checkpoints
            (`callbacks.FaultTolerantBackup`): rerun the same command after a
            kill or preemption and training resumes at the exact batch. The
            "auto" choices are then taken from the checkpoint's plan.
            Defaults to `None`: `AIP_CHECKPOINT_DIR` on Vertex AI, else no
            checkpoints. A `FaultTolerantBackup` in `callbacks` is used as is.
        checkpoint_freq: The backup's `save_freq`: "epoch", every N batches,
            or a duration like "10min". Defaults to "epoch".
        log_dir: Where `callbacks.Throughput` (samples/s, step times, ETA)
            and, on GPUs, `callbacks.GPUMonitor` write TensorBoard scalars;
            their figures also go into `History`. Defaults to `None`: neither.
        profile: True traces steps 10-14 with `tf.profiler`
            (`callbacks.ProfileWindow`) into `log_dir` (default
            "kerascale_logs"); (start, stop) picks the steps. Defaults to False.
        time_budget: Seconds, or "18h", "90min": stop gracefully before
            then, leaving time for the final checkpoint
            (`callbacks.TimeBudget`). Defaults to `None`.
        worker_timeout: On a cluster, seconds (or "2min") a worker may stay
            silent before the others stop with `WorkerLostError`; the limits
            on start-up and on one exchange scale with it (see
            `kerascale.multiworker`). Defaults to `None`: what
            `connect_cluster` was given, else 60.
        verbose: As in `model.fit`; 0 also silences kerascale. Defaults to
            "auto".
        **fit_kwargs: Passed to `model.fit` (epochs, callbacks,
            validation_data, steps_per_epoch, ...).

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
    options, search = _validate(
        batch_size=batch_size,
        strategy=strategy,
        precision=precision,
        max_batch_size=max_batch_size,
        memory_limit=memory_limit,
        accumulation_steps=accumulation_steps,
        lr_scaling=lr_scaling,
        base_batch_size=base_batch_size,
        optimize_data=optimize_data,
        verbose=verbose,
    )
    monitor = monitoring.validate_fit_options(log_dir, profile, time_budget)
    if worker_timeout is not None:
        multiworker.validate_timeout(worker_timeout)
    hw = hardware_lib.detect_hardware()
    # Before anything else runs TensorFlow: it joins a cluster only then.
    clustered = multiworker.join_if_wanted(hw, options.strategy, worker_timeout)
    backup = resume.backup_for(
        checkpoint_dir, checkpoint_freq, fit_kwargs, options.verbose
    )
    pinned: list[str] = []
    if backup is not None:
        options, pinned = resume.pin(options, backup.saved_plan(), x, y)
    steps = fit_kwargs.get("steps_per_epoch")
    decided = decide(
        model, x, y, options, steps_per_epoch=steps, search=search, hardware=hw
    )
    if clustered:
        decided = agree(decided, options)
    decided = resume.say_pinned(decided, pinned)
    plan = decided.plan
    dist = strategy_lib.build(plan, decided.instance)
    if dist.num_replicas_in_sync != plan.replicas:
        # Only a TPU's core count is unknown before its system is initialised.
        options = dataclasses.replace(options, strategy=dist)
        decided = decide(
            model,
            x,
            y,
            options,
            steps_per_epoch=steps,
            search=search,
            hardware=decided.hardware,
        )
        plan = decided.plan

    train_model = model
    if plan.rebuild:
        try:
            train_model = precision_lib.rebuild(model, plan.precision, dist)
        except ModelError:
            raise
        except Exception as e:
            if precision_lib.is_builder(model):
                raise
            why = f"re-creating it failed: {type(e).__name__}: {e}"
            decided = decide(
                model,
                x,
                y,
                options,
                steps_per_epoch=steps,
                search=search,
                hardware=decided.hardware,
                not_rebuildable=why,
            )
            decided = resume.say_pinned(decided, pinned)
            plan = decided.plan
            dist = strategy_lib.build(plan, decided.instance)
    if not isinstance(train_model, keras.Model) or not train_model.compiled:
        raise ModelError(
            "The model builder must return a compiled model: call "
            "model.compile(optimizer=..., loss=...) inside it."
        )

    plan = multiworker.start_alike(train_model, dist, plan, decided.data, x)

    quiet_end_of_data = False
    if decided.data.kind == "dataset":
        # Keras ignores shuffle for a dataset and warns when it is left True.
        fit_kwargs.setdefault("shuffle", False)
        original = x
        x = data_lib.prepare(x, decided.data, plan, optimize=decided.optimize_data)
        quiet_end_of_data = "steps_per_epoch" not in fit_kwargs and (
            data_lib.lost_cardinality(original, x)
        )
    elif decided.data.kind == "arrays":
        fit_kwargs["batch_size"] = plan.step_batch_size
    if "validation_data" in fit_kwargs:
        fit_kwargs["validation_data"] = data_lib.prepare_validation(
            fit_kwargs["validation_data"],
            plan,
            optimize=decided.optimize_data,
            validation_steps=fit_kwargs.get("validation_steps"),
        )

    if backup is not None:
        backup.plan = plan
    fit_kwargs["callbacks"] = [
        *(fit_kwargs.get("callbacks") or []),
        *monitoring.for_fit(
            *monitor,
            samples_per_step=plan.step_batch_size,
            gpus=len(decided.hardware.gpus),
            backup=backup,
        ),
    ]
    if options.verbose != 0:
        print(plan, flush=True)
    for w in plan.warnings:
        logger.warning(w)

    saved = None
    if plan.accumulation_steps > 1 or plan.lr_factor != 1.0:
        saved = accumulation_lib.apply(
            train_model, plan.accumulation_steps, plan.lr_factor
        )
    try:
        with warnings.catch_warnings():
            if quiet_end_of_data:
                warnings.filterwarnings("ignore", "Your input ran out of data")
            history = train_model.fit(x, y, verbose=options.verbose, **fit_kwargs)
    except Exception as e:
        lost = multiworker.translate_error(e)
        if lost is not None:
            raise lost from e
        raise
    finally:
        # Also after an interrupt: like model.fit, keep what was trained so far.
        if saved is not None:
            accumulation_lib.finish(
                train_model, saved, plan.accumulation_steps, plan.global_batch_size
            )
        if train_model is not model and not precision_lib.is_builder(model):
            precision_lib.copy_back(train_model, model)
    if not precision_lib.is_builder(model):
        history.set_model(model)
    history.plan = plan
    return history


def plan(
    model: ModelOrBuilder,
    x: Any = None,
    y: Any = None,
    *,
    batch_size: int | str = "auto",
    strategy: Any = "auto",
    precision: str = "auto",
    max_batch_size: int | None = None,
    memory_limit: int | str | None = None,
    accumulation_steps: int | None = None,
    lr_scaling: str | None = None,
    base_batch_size: int | None = None,
    optimize_data: bool | str = "auto",
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_freq: int | str = "epoch",
    log_dir: str | os.PathLike | None = None,
    profile: bool | tuple[int, int] = False,
    time_budget: float | str | None = None,
    worker_timeout: float | str | None = None,
    verbose: int | str = "auto",
    **fit_kwargs: Any,
) -> Plan:
    """Returns the `Plan` that `fit` would apply, without training.

    Takes the same arguments as `kerascale.fit`. Your model is not trained or
    changed (an unbuilt model is built from the data's shape); only the
    batch-size search's probes and, on a CPU, the trials of the choices left
    to kerascale train copies of it (both cached).

    Example:

    >>> p = kerascale.plan(model, ds)
    >>> p.precision, p.global_batch_size
    """
    options, search = _validate(
        batch_size=batch_size,
        strategy=strategy,
        precision=precision,
        max_batch_size=max_batch_size,
        memory_limit=memory_limit,
        accumulation_steps=accumulation_steps,
        lr_scaling=lr_scaling,
        base_batch_size=base_batch_size,
        optimize_data=optimize_data,
        verbose=verbose,
    )
    monitoring.validate_fit_options(log_dir, profile, time_budget)
    if worker_timeout is not None:
        multiworker.validate_timeout(worker_timeout)
    fit_kwargs = dict(fit_kwargs)
    backup = resume.backup_for(
        checkpoint_dir, checkpoint_freq, fit_kwargs, options.verbose
    )
    pinned: list[str] = []
    if backup is not None:
        options, pinned = resume.pin(options, backup.saved_plan(), x, y)
    steps = fit_kwargs.get("steps_per_epoch")
    decided = decide(model, x, y, options, steps_per_epoch=steps, search=search)
    return resume.say_pinned(decided, pinned).plan


def _validate(
    *, max_batch_size, memory_limit, **kwargs
) -> tuple[Options, SearchOptions]:
    options = Options.validate(max_batch_size=max_batch_size, **kwargs)
    search = SearchOptions.validate(
        max_batch_size=max_batch_size,
        memory_limit=memory_limit,
        min_steps_per_epoch=AUTO_MIN_STEPS,
    )
    return options, search
