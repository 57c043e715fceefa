"""A distribution decision, whichever backend's rules made it."""

from __future__ import annotations

import dataclasses
from typing import Any

from kerascale.plan.reasons import Reason


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """The strategy (TensorFlow) or distribution (JAX) a plan trains under.

    Attributes:
        name: Its name in the plan.
        devices: The devices that hold a replica.
        replicas: How many ways each batch is split.
        reason: Why.
        warnings: What the user should know about it.
        instance: The user's own strategy or distribution, if one was passed.
        scoped: Whether variables must be created under it (a
            `tf.distribute` strategy's scope); a model built outside is
            then re-created. JAX's distributions need no scope.
    """

    name: str
    devices: tuple[str, ...]
    replicas: int
    reason: Reason
    warnings: tuple[str, ...] = ()
    instance: Any = None
    scoped: bool = True
