"""A first figure for a JAX training step, for the run's budget: the
compiled forward pass timed, times XLA's count of a training step's
operations over the forward's (the gradient is lowered, not compiled).

Its design: docs/design/modules.md, `kerascale.measure.jax.estimate`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras

from kerascale.sense.model_facts import output_elements

FORWARD_BATCH = 32
# Compiled only from this many operations in a forward pass of FORWARD_BATCH
# (about a millisecond of XLA's CPU code on 2 cores, where eager dispatch
# costs as much): a small model's compile and count cost 80-110 ms, its
# eager passes 3-5 ms once its ops are compiled in the process (Keras's
# fit tests, a model a test: routed 1.08x and 1.36x the plain time on 1 and
# 2 devices with every model compiled, 2026-11-28). The reference CNN counts
# 336 million, an MLP 3072-1024-1024-10 about 270 million.
MIN_FLOPS = 50e6
# Not even lowered (15 ms for a model of two small Dense layers) where the
# model has fewer parameters and fewer output elements a sample than this.
TINY = 10_000


def train_seconds_per_sample(
    model: Any,
    inputs: Callable[[int], Any],
    train_per_forward: float,
    *,
    first: bool = False,
) -> float | None:
    """Seconds per sample of one training step of `model` on `inputs(batch)`;
    `train_per_forward` where XLA gives no count of a step's operations. None
    for a model whose forward pass XLA counts under `MIN_FLOPS` (or not at
    all): its compile would cost more than the eager figure, unless `first`
    (the process's first estimate: no eager operation of it is compiled yet,
    and the eager figure costs each its compile: 0.67 s for issue 78's
    notebook MLP of 22,000 parameters, against 0.17 s compiled). Changes
    nothing in the model: the variables' values are read, never assigned.

    Raises:
        Exception: Whatever tracing or running the model raises (the caller
            falls back to an eager figure).
    """
    import jax
    import jax.numpy as jnp

    if model.count_params() < TINY and output_elements(model) < TINY:
        return None  # even its lowering costs more than eager passes
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    made = inputs(FORWARD_BATCH)

    def forward(tv: Any, ntv: Any, x: Any) -> Any:
        return model.stateless_call(tv, ntv, x, training=False)[0]

    def summed(tv: Any, ntv: Any, x: Any) -> Any:
        out = model.stateless_call(tv, ntv, x, training=True)[0]
        floats = [
            jnp.sum(o.astype("float32"))
            for o in keras.tree.flatten(out)
            if jnp.issubdtype(o.dtype, jnp.floating)
        ]
        return sum(floats, jnp.float32(0))

    lowered = jax.jit(forward).lower(trainable, non_trainable, made)
    forward_flops = _flops(lowered)
    if forward_flops < MIN_FLOPS and not first:
        return None  # a small model: its compile costs more than eager passes
    step = lowered.compile()

    def timed() -> float:
        start = time.perf_counter()
        jax.block_until_ready(step(trainable, non_trainable, made))
        return time.perf_counter() - start

    # Always two runs (the first also places the inputs), whatever they
    # take: the processes of a JAX cluster must run a computation alike.
    timed()
    seconds = timed()
    ratio = train_per_forward
    if trainable:
        grad = jax.jit(jax.grad(summed)).lower(trainable, non_trainable, made)
        train_flops = _flops(grad)
        if train_flops:
            ratio = max(1.0, train_flops / forward_flops)
    return ratio * seconds / FORWARD_BATCH


def _flops(lowered: Any) -> float:
    """XLA's count of a lowered computation's floating-point operations, 0
    where it gives none (`cost_analysis` is a dict, a list of one dict in
    older JAX, or None)."""
    try:
        cost = lowered.cost_analysis()
    except Exception:  # a backend without the analysis
        return 0.0
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return float((cost or {}).get("flops", 0.0) or 0.0)
