"""`SearchRequest`: one batch-size search, as either engine takes it
(`engines.batch_search`: TensorFlow's probes, XLA's count on JAX)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerascale.measure.batch import SearchOptions
    from kerascale.plan.plan import Plan
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.hardware import Hardware


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """One batch-size search.

    Attributes:
        model: The user's model or builder (user data: any Keras model).
        x, y: The training data as the user gave it.
        data: Facts about the data.
        plan: The plan searched for: its precision, strategy, accumulation
            and recomputation.
        hardware: What is here.
        options: The search's options (the memory bounds, the mode).
        instance: The user's own `tf.distribute.Strategy`, or None.
        verbose: `fit`'s verbosity: a line before a search that probes.
        first: The per-replica batch tried first (a requested one), or None.
        accumulation_steps: Accumulators held beside the micro-batch (the
            split a requested batch will need), or None for the plan's.
        budget: The run a "ladder" must repay (`budget.RunBudget`), or None.
        timed: The largest batch that fits also runs real steps (where its
            speed decides).
    """

    model: Any
    x: Any
    y: Any
    data: DataFacts
    plan: Plan
    hardware: Hardware
    options: SearchOptions
    instance: Any = None
    verbose: Any = "auto"
    first: int | None = None
    accumulation_steps: int | None = None
    budget: Any = None
    timed: bool = False
