"""`kerascale.find_batch_size`: the batch-size search on its own."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from kerascale import _validation, errors
from kerascale.errors import BatchSizeSearchError, ConfigurationError, UnsupportedError
from kerascale.measure import answered
from kerascale.measure import decide as decide_lib
from kerascale.measure.decided import Decided
from kerascale.measure.request import DEFAULT_MARGIN, MODES, SearchOptions
from kerascale.measure.result import BatchSearchResult
from kerascale.measure.stages import Call
from kerascale.plan import fallback
from kerascale.plan import reasons as reasons_lib
from kerascale.plan.goodput import MIN_UPDATES
from kerascale.plan.options import Options
from kerascale.sense import backend as backend_lib


def find_batch_size(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    mode: str = "max",
    isolate: Any = "auto",
    memory_limit: int | str | None = None,
    device_memory: int | str | None = None,
    max_batch_size: int | None = None,
    steps_per_trial: int = 3,
    margin: float = DEFAULT_MARGIN,
    max_trials: int = 20,
    timeout: float = 600.0,
    cache: bool = True,
    remeasure: bool = False,
    strategy: Any = "auto",
    precision: str = "auto",
    recompute: Any = "auto",
    verbose: Any = "auto",
    force: Any = None,
) -> BatchSearchResult:
    """Finds the largest batch that trains without running out of memory.

    On TensorFlow each probe is a real training step on a synthetic batch
    like your data, under the precision and strategy `fit` would use (on CPU
    in child processes); a memory model fitted to small probes predicts the
    boundary, probes around it confirm it (cached). On JAX, XLA's memory
    analysis of the compiled step answers, in at most 5 compiles.

    Args:
        model: A compiled Keras model, or a function that builds one.
        x, y: Training data as for `kerascale.fit` (a dataset, or arrays
            and their targets); only its shapes and size are used.
        mode: "max": the largest batch that fits, less `margin`.
            "throughput": the smallest batch within 3% of the best measured
            samples/s under the memory bound. Defaults to "max".
        isolate: True: probes in child processes; False: in this process;
            "auto" (default): on CPU, children where the model can be shipped.
        memory_limit: Bytes, or "6GiB": per GPU on GPUs; on CPU, resident
            memory (RSS, TensorFlow's ~0.6 GiB included). Defaults to `None`:
            on GPU, what the allocator gives; on CPU, 80% of what is free.
        device_memory: Bytes, or "160MiB": one device's memory (JAX), as
            in `kerascale.fit`; counted per device. Defaults to `None`.
        max_batch_size: The largest global batch to consider (default: the
            dataset size, at most 65536).
        steps_per_trial, margin, max_trials, timeout: Steps per probe (the
            first warms up; 3); the fraction kept below the largest batch
            that fits (0.03); the most probes (20); seconds before a probe
            is killed (600).
        cache: Use the result cache (True, the default), or neither read
            nor write it (False).
        remeasure: Search anew even where the cache has an answer (and
            write the new one), as `kerascale.fit`'s `remeasure`.
        strategy, precision: As in `kerascale.fit` ("auto").
        recompute: "auto": where memory stops the search, also the bound
            with recomputation (fit's `recompute=True`), in
            `.recompute_batch_size`. True: with it only; False: without.
        verbose: 0 prints nothing, else a line per probe. Defaults to "auto".
        force: Deprecated: the old name of `remeasure`.

    Returns:
        A `BatchSearchResult`: `.batch_size` (all replicas, as `fit` takes
        it), `.precision`, `.probes`, `.recompute_batch_size`...

    Raises:
        ConfigurationError: For an invalid argument (named in the message).
        UnsupportedError: On a backend other than TensorFlow and JAX.
        BatchSizeSearchError: If even a batch of 1 does not fit, or a probe
            fails for a reason other than memory.

    >>> result = kerascale.find_batch_size(model, x, y, memory_limit="4GiB")
    >>> kerascale.fit(model, x, y, epochs=10, **result.fit_kwargs())

    `fit_kwargs()` trains at the answer with the learning rate scaled for
    it, and keeps an epoch's updates where the answer is most of a small
    dataset (see `BatchSearchResult.fit_kwargs`).
    """
    options, search = _validated(
        mode=mode,
        isolate=isolate,
        memory_limit=memory_limit,
        device_memory=device_memory,
        max_batch_size=max_batch_size,
        steps_per_trial=steps_per_trial,
        margin=margin,
        max_trials=max_trials,
        timeout=timeout,
        cache=cache,
        remeasure=remeasure,
        strategy=strategy,
        precision=precision,
        recompute=recompute,
        verbose=verbose,
        force=force,
    )
    _supported_backend()

    def searched(attempt: fallback.Attempt) -> Decided:
        return decide_lib.decide(
            model,
            x,
            y,
            attempt.options,
            stages=decide_lib.SEARCH,
            call=Call(attempt=attempt),
            search=search,
        )

    decided = fallback.attempted(searched, options)
    result = _with_precision(decided, search.mode)
    # fit's check of this answer in this process reads it (`answered`).
    answered.remember(model, x, y, decided.plan, search, result)
    return result


# An answer that leaves this few updates an epoch is said: the largest
# batch that fits may be the whole of a small dataset.
FEW_UPDATES = 2


def _with_precision(decided: Decided, mode: str) -> BatchSearchResult:
    """The search's result with the precision to train it under, and why
    (a CPU's trials of both, with their figures), among its reasons: the
    one the probes trained under, unless the trials timed the other faster
    at its batch (`result.precision` is what `fit` should be passed)."""
    found = decided.search
    if found is None:  # it cannot answer here (no memory figure, a CPU...)
        why = decided.search_skipped or " ".join(decided.plan.warnings)
        fix = (
            "pass mode='max' for the largest batch that fits, or "
            if mode != "max"
            else ""
        )
        raise BatchSizeSearchError(
            f"The batch size cannot be searched here: {why}. Instead, "
            f"{fix}choose batch_size yourself."
        )
    n = decided.data.num_samples
    updates = -(-n // found.batch_size) if n and found.batch_size else None
    if updates is not None and updates <= FEW_UPDATES:
        errors.warn(
            f"batch_size {found.batch_size} leaves {updates} optimizer update(s) "
            f"an epoch of the {n} samples. Train with result.fit_kwargs() "
            f"(at most the answer, {MIN_UPDATES} updates an epoch, the learning "
            "rate scaled), or pass max_batch_size= for more updates an epoch, "
            "or mode='throughput' for the fastest batch."
        )
    dropped = found.reasons.get("recompute", "")
    if reasons_lib.code(dropped) == "recompute.weigh_failed":
        errors.warn(f"The batch search's bound with recomputation: {dropped}.")
    why = decided.plan.reasons.get("precision", "")
    timed = decided.trials is not None and decided.trials.measured("precision")
    if timed and decided.plan.precision != found.precision:
        # The trials timed the other precision faster at this batch (only
        # where it fits it): that is the one to pass to fit, and said so.
        why = reasons_lib.noted(
            why,
            f"the batch was searched under {found.precision}; "
            f"{decided.plan.precision} was timed at it and fits it",
        )
        found = dataclasses.replace(found, precision=decided.plan.precision)
    return dataclasses.replace(
        found, reasons={**found.reasons, "precision": why}, samples=n
    )


def _validated(
    *,
    remeasure: Any,
    force: Any,
    strategy: Any,
    precision: Any,
    verbose: Any,
    recompute: Any,
    mode: Any,
    **search: Any,
) -> tuple[Options, SearchOptions]:
    """`find_batch_size`'s arguments, checked at the door: the options of the
    decision, and the search's (`search`: `SearchOptions`' fields)."""
    _validation.boolean("remeasure", remeasure)
    if force is not None:
        _validation.boolean("force", force)
        warnings.warn(
            "find_batch_size(force=...) is now remeasure=..., the name "
            "kerascale.fit uses; force= will be removed in a later release.",
            DeprecationWarning,
            stacklevel=3,
        )
        if remeasure and not force:
            raise ConfigurationError(
                "find_batch_size got remeasure=True and force=False, which "
                "disagree. Pass remeasure= only (force= is its old name)."
            )
        remeasure = remeasure or force
    options = Options.validate(
        strategy=strategy,
        precision=precision,
        verbose=verbose,
        optimize_data=False,
        recompute=recompute,
    )
    _validation.one_of("mode", mode, MODES)
    return options, SearchOptions.validate(mode=mode, force=remeasure, **search)


def _supported_backend() -> None:
    if not backend_lib.supported():
        raise UnsupportedError(
            f"find_batch_size runs on the TensorFlow and JAX backends, and Keras "
            f"runs on {backend_lib.name()!r} here. Pass batch_size= to fit yourself."
        )
