"""What measures on each backend: the one place the measure floor picks by
backend.

- How the batch search measures a batch (`batch_search`: the one search,
  `measure.batch.run_search`, with the backend's engine): TensorFlow's
  real steps (`measure.batch.Probes`), or XLA's memory analysis of the
  compiled step (`measure.jax.search.XlaAnalysis`).
- Whether one replica fits a device, else the mesh to shard over (JAX).
- The first estimate of a training step, where it is compiled (JAX:
  `measure.jax.estimate`; elsewhere the eager one in `measure.budget`).
- The timing that `diagnose` reads: `measure.tensorflow.timing` or
  `measure.jax.timing` (the same `rates`, `AS_DATASET`, `READABLE`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from kerascale.plan.measured import Measured


def batch_search(request: Any) -> Any:
    """`batch.run_search` of `request` (a `SearchRequest`), measured by the
    engine of its backend (`search_engine`)."""
    from kerascale.measure import batch

    return batch.run_search(request, search_engine(request.hardware.backend))


def search_engine(backend: str) -> Any:
    """How `batch.run_search` measures a batch on `backend` (a
    `batch.Engine`)."""
    if backend == "jax":
        from kerascale.measure.jax import search

        return search.XlaAnalysis()
    from kerascale.measure import batch

    return batch.Probes()


def sharding(backend: str) -> Callable[..., Any]:
    """The check that one replica fits a device, and the mesh to shard over
    where not (JAX's `ModelParallel`); elsewhere the plan as it is."""
    if backend == "jax":
        from kerascale.measure.jax import replica_fit

        return replica_fit.plan_sharding

    def as_it_is(model, x, y, options, planner, search):
        return options, Measured()

    return as_it_is


def timing(backend: str) -> ModuleType:
    """The step and input timing of `backend`."""
    if backend == "jax":
        from kerascale.measure.jax import timing as jax_timing

        return jax_timing
    from kerascale.measure.tensorflow import timing as tensorflow_timing

    return tensorflow_timing


def compiled_estimate(backend: str) -> Callable[..., float | None] | None:
    """The first estimate of a training step compiled on `backend`
    (`measure.jax.estimate`), or None where the eager one is used."""
    if backend == "jax":
        from kerascale.measure.jax import estimate

        return estimate.train_seconds_per_sample
    return None
