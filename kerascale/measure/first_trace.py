"""What bf16 costs a `fit` call before it gains anything: the policy set in
place and the first step's trace under it, beyond float32's.

Measured once per machine and backend (kept in kerascale's cache) on a small
reference model (a first training step at float32, against one under
`mixed_bfloat16` set in place as `fit` sets it), and scaled to the user's
model by its layers: tracing costs per operation. Nothing of the measurement
stays: the reference models' layers are named, Keras's name counters and
the random state are put back.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from kerascale import _keras_compat as keras_compat
from kerascale._state import preserved_state
from kerascale.plan.reasons import Reason

if TYPE_CHECKING:
    from kerascale.measure.budget import RunBudget
    from kerascale.plan.plan import Plan

REFERENCE_LAYERS = 4
# What bf16 saves of a CPU step where it is faster (at least): float32 steps
# 1.40x longer on the AVX512-BF16 CPU of benchmarks/README.md's overhead
# table (a saving of 0.29), a conv net's 1.3-1.9x.
BF16_SAVING = 0.25
# The reference's extra is a difference of two noisy timings: it is taken as
# at least what setting the policy in place measured alone (benchmarks/
# README.md's overhead table: 25 ms a call on 2 cores).
MIN_EXTRA_SECONDS = 0.025
# A run of at most this many steps is not timed to weigh bf16: the speed
# estimate (eager forward passes) costs about as much as such a run (a
# keras-hub RetinaNet: 6.5 s a fit of one step), and bf16 would need steps
# longer than its whole start to repay it.
FEW_STEPS = 8
# A saving this large repays any start-up cost measured here (the
# reference's extra was 0.07 s on TensorFlow, 0.3 s on JAX, on 2 cores).
SURELY_REPAID_SECONDS = 5.0


def _reference(name: str) -> Any:
    layers: list[Any] = [keras.Input((32,), name=f"{name}_in")]
    layers += [
        keras.layers.Dense(64, activation="relu", name=f"{name}_dense_{i}")
        for i in range(REFERENCE_LAYERS - 1)
    ]
    layers.append(keras.layers.Dense(10, name=f"{name}_out"))
    model = keras.Sequential(layers, name=name)
    model.compile(keras.optimizers.SGD(name=f"{name}_sgd"), "mse")
    return model


def _first_step(policy: str) -> float:
    """Seconds of a fresh reference model's first training step (its trace
    and one step) under `policy`, set in place as `fit` sets it."""
    from kerascale.apply import precision

    model = _reference("kerascale_reference")
    x, y = np.zeros((32, 32), "float32"), np.zeros((32, 10), "float32")
    start = time.perf_counter()
    undo = precision.apply(model, policy) if policy != "float32" else None
    model.train_on_batch(x, y)
    if undo is not None:
        undo()
    return time.perf_counter() - start


@functools.cache
def bf16_extra_seconds(backend: str) -> float:
    """Seconds a reference model's first step takes longer under
    `mixed_bfloat16` set in place than in float32 (at least 0): read from
    kerascale's cache, else measured once and cached, so that every run of
    a script on this machine weighs bf16 alike (a timing read anew in each
    process put a run and its rerun on two sides of the line)."""
    from kerascale.measure import cache

    key = cache.cache_key(
        {"first_trace": 1, "backend": backend, "cores": os.cpu_count()}
    )
    cached = cache.cache_read("first_trace", key)
    if cached is not None and isinstance(cached.get("seconds"), int | float):
        return float(cached["seconds"])
    with preserved_state(), keras_compat.names_kept():
        _first_step("float32")  # the backend's own first-call setup
        extra = [-_first_step("float32") + _first_step("mixed_bfloat16") for _ in "abc"]
    seconds = max(0.0, statistics.median(extra))
    cache.cache_write("first_trace", key, {"seconds": seconds})
    return seconds


def bf16_repays(model: Any, backend: str, run_seconds: float) -> tuple[bool, float]:
    """(whether bf16 saves more over a float32 run of `run_seconds` than it
    costs `model` at the start, that cost in seconds)."""
    saving = BF16_SAVING * run_seconds
    if saving > SURELY_REPAID_SECONDS:
        return True, 0.0  # nothing to measure
    layers = len(keras_compat.all_layers(model)) if hasattr(model, "layers") else 0
    extra = max(MIN_EXTRA_SECONDS, bf16_extra_seconds(backend))
    cost = extra * max(1.0, layers / REFERENCE_LAYERS)
    return saving > cost, cost


def why_float32(model: Any, plan: Plan, budget: RunBudget) -> Reason | None:
    """Why a run under `plan` (its `budget`)
    stays float32 rather than take the CPU rule's bf16, or None. A run of
    unknown length stays float32 (Keras's steps_per_execution test trained
    a dataset of unknown size after one with steps_per_epoch: in bf16 and in
    float32, 0.2% apart); a model that cannot be run before training (no
    first speed) keeps the rule."""
    samples = budget.samples(plan)
    if samples is None:  # as model.fit trains: nothing shows bf16 repays
        return Reason("precision.length_unknown")
    steps = -(-samples // max(1, plan.global_batch_size))
    # An estimate of the speed would cost about as much as a run this short.
    repays, cost = (
        bf16_repays(model, plan.backend, 0.0) if steps <= FEW_STEPS else (True, 0.0)
    )
    if not repays:
        return Reason(
            "precision.few_steps",
            steps=steps,
            cost=cost,
            need=cost / (BF16_SAVING * steps),
        )
    if budget.per_sample is None:
        return None
    run = samples * budget.per_sample
    repays, cost = bf16_repays(model, plan.backend, run)
    if repays:
        return None
    return Reason("precision.too_short", run=run, cost=cost)
