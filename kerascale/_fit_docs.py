"""The arguments `kerascale.fit` and `kerascale.plan` share, documented
once for both (`documented` puts them into each docstring)."""

from __future__ import annotations

from collections.abc import Callable

# The arguments `fit` and `plan` share, documented once for both.
_ARGUMENTS = """\
        model: A compiled Keras model (or a layer with Keras's `Trainer`
            mixed in), or a zero-argument function that builds and compiles
            one (a plain function, a `functools.partial` or a callable object
            that is not a layer).
        x: Whatever `model.fit` takes: a `tf.data.Dataset` (batched or not)
            yielding `(inputs, targets)`, input arrays, a
            `keras.utils.PyDataset`, a Python generator, a grain dataset...
            The batch search and trials need a dataset or arrays of numbers;
            the rest goes to Keras unread, and one warning says what was
            skipped.
        y: Target arrays when `x` is arrays; None for a dataset.
        batch_size: Samples per optimizer update (Keras's meaning). "auto":
            your batched dataset's batch size; for unbatched data, on GPUs
            and TPUs the largest batch that fits (cached, see
            `find_batch_size`), on a CPU Keras's 32 (checked against
            `memory_limit` where you give one): a CPU's fastest batch in
            samples per second is not its fastest to an accuracy. An int
            larger than what fits in memory is reached with gradient
            accumulation: micro x replicas x accumulation_steps =
            batch_size. None or 0 is Keras's own batch, as in `model.fit`:
            32 for arrays (or one that covers the samples left after
            `validation_split` in `steps_per_epoch` steps), a dataset's
            own. Defaults to "auto".
        strategy: "auto", "default", "one_device", "mirrored",
            "multi_worker", "tpu", or a `tf.distribute.Strategy`. "auto"
            trains across the cluster that TF_CONFIG, Vertex AI's
            CLUSTER_SPEC or SLURM describes (`MultiWorkerMirroredStrategy`;
            call `kerascale.connect_cluster()` first in the script), else on
            this machine's devices. Defaults to "auto".
        precision: "auto", "float32", "mixed_float16" or "mixed_bfloat16".
            Defaults to "auto".
        max_batch_size: The largest batch (all replicas) to put through the
            model in one forward pass: it caps the search, and a larger
            `batch_size` is split into micro-batches of at most this size.
            Defaults to `None`: measured where memory is tight (GPUs, TPUs,
            or with `memory_limit`), else no bound.
        memory_limit: Memory training must fit in: bytes or "6GiB". Per GPU
            on GPUs; on CPU, the training process's resident memory (RSS:
            what a container's limit and the kernel's out-of-memory killer
            count), TensorFlow's own ~0.6 GiB included. Defaults to `None`:
            on GPU, what TensorFlow's allocator in this process gives (it is
            measured there); on CPU, 80% of the memory available.
        device_memory: Memory of one device: bytes or "160MiB" (JAX). What
            a GPU or TPU reports; CPU devices report none, and it plans for
            a device you do not have. Where one replica does not fit it,
            the model's large variables are split over the devices
            (`ModelParallel`); the batch search counts against it per
            device. Defaults to `None`: the device's own figure (none on CPU).
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
        start_over: Train from scratch even where `checkpoint_dir` holds
            checkpoints (a finished run, another configuration's); the new
            run's checkpoints replace them. Defaults to False.
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
            `kerascale.apply.tensorflow.cluster`). Defaults to `None`: what
            `connect_cluster` was given, else 60.
        recompute: Recompute activations in the backward pass instead of
            keeping them (Keras's remat, "activations" mode, set on your
            model's layers for the run and taken off after). "auto": where
            the batch wanted does not fit in one forward pass, kerascale
            finds the bound with recomputation too and keeps it only where
            it trains measurably faster than gradient accumulation alone
            (the plan's "recompute" row gives both figures). True: always;
            False: never. Defaults to "auto".
        steps_per_execution: Training steps per call into the compiled
            step (Keras's `compile(steps_per_execution=...)`, set on your
            model for the run and put back after). "auto": chosen in the
            run, with nothing timed before it: the first epoch runs at 1
            and is timed; where a step is short enough that the host's path
            between steps (fetching the batch, the call, the callbacks'
            batch hooks) is worth cutting and the rest of the run repays a
            new trace, the next epochs run at the largest value that keeps
            a call under a second and a quarter of an epoch, kept where a
            step there is faster (else back to 1); it stays 1 where a
            callback of yours (or one of Keras's) overrides a batch hook,
            which Keras then calls once per call, and it divides an integer
            `checkpoint_freq`. A value you gave `compile` is kept. An int:
            that many, whatever the callbacks. The weights are those of one
            step a call. Defaults to "auto".
        materialize: A folder: the deterministic part of your `tf.data`
            pipeline (decoding, parsing) is written there once as shards,
            and every epoch after reads them back in parallel, the random
            part (shuffle, augmentation, batch) applied on reading
            (`kerascale.data.materialize`; verified before reuse, and
            written again when the pipeline or its files change). `plan`
            only says what `fit` would do. Where the split cannot be told,
            the pipeline trains as given, with a warning. Defaults to
            `None`.
        remeasure: Measure again (the batch search, the trials) instead of
            using kerascale's cached measurements, which the new ones replace.
            `kerascale.clear_cache()` forgets them all. Defaults to False.
        verbose: As in `model.fit`: 0 prints no progress, kerascale's
            included (its warnings still show, as Keras's do); 2 also prints
            the plan's reasons in full (`plan.explain()`), where 1 and "auto"
            print them in brief. Defaults to "auto".
        **fit_kwargs: Passed to `model.fit` (epochs, callbacks,
            validation_data, steps_per_epoch, ...)."""


def documented(function: Callable) -> Callable:
    """Puts the shared argument documentation into `function`'s docstring."""
    function.__doc__ = function.__doc__.replace("{arguments}", _ARGUMENTS.strip())
    return function
