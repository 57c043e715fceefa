"""Which distribution a plan trains under: the one place the plan floor picks
by backend. TensorFlow's `tf.distribute` strategies are
`plan.strategy.tensorflow`'s rules; JAX's `keras.distribution`,
`plan.strategy.jax`'s. Each function here is that module's, for the backend
of this process (or of the hardware record it is given). Pure; building the
object is `kerascale.apply.strategy`'s job.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kerascale.plan.choice import StrategyChoice
from kerascale.plan.strategy import jax as jax_rules
from kerascale.plan.strategy import tensorflow as tensorflow_rules
from kerascale.plan.strategy.tensorflow import local_equivalent
from kerascale.sense import backend as backend_lib
from kerascale.sense.hardware import Hardware

__all__ = [
    "choose",
    "local_equivalent",
    "resolve_request",
    "validate_request",
    "wants_cluster",
]


def rules_for(backend: str | None = None) -> ModuleType:
    """The strategy rules of `backend` (default: this process's)."""
    return jax_rules if (backend or backend_lib.name()) == "jax" else tensorflow_rules


def resolve_request(strategy: Any) -> Any:
    """A validated `strategy` as the rules take it: on JAX, "auto" means the
    `keras.distribution` set before the call (`set_distribution`), where
    there is one (the user's choice wins, for every door)."""
    if strategy == "auto" and rules_for() is jax_rules:
        return jax_rules.global_distribution() or strategy
    return strategy


def validate_request(strategy: Any) -> None:
    """Accepts this backend's names or its own distribution object: on
    TensorFlow a `tf.distribute.Strategy`, on JAX a Distribution."""
    rules_for().validate_request(strategy)


def choose(hw: Hardware, requested: Any) -> StrategyChoice:
    """Picks the distribution for `requested` ("auto", a name, or an
    instance) on `hw`'s backend.

    Raises:
        ClusterConfigError: If the environment describes a malformed cluster.
        UnsupportedError: For a cluster task that does not train (a
            parameter server or an evaluator).
        ConfigurationError: If a named strategy cannot run here (e.g. "tpu"
            without a TPU).
    """
    return rules_for(hw.backend).choose(hw, requested)


def wants_cluster(hw: Hardware, requested: Any) -> bool:
    """Whether `requested` trains across the TensorFlow cluster the
    environment describes (`TF_CONFIG`, SLURM, Vertex AI); never on a
    backend that does not join such clusters (JAX's processes join through
    `jax.distributed`)."""
    if not backend_lib.traits(hw.backend).joins_tf_clusters:
        return False
    return tensorflow_rules.wants_cluster(hw, requested)
