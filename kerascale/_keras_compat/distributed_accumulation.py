"""keras#20582: gradient accumulation on an optimizer built under a
tf.distribute strategy of its own applies its gradients wrongly; the
smallest fix, on that object only (listed in `PRIVATE_NAMES`)."""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any

from kerascale.errors import warn


def fix_distributed_accumulation(opt: Any) -> None:
    """keras#20582: on an optimizer built under a tf.distribute strategy of
    its own, accumulation applies gradients through
    `_distributed_apply_gradients` (this object only); elsewhere Keras's
    path works and is kept."""
    import types

    if _built_under_a_strategy(opt) and upstream_known(warn_if_not=True):
        opt._backend_apply_gradients = types.MethodType(
            _distributed_apply_gradients, opt
        )


# Keras's `BaseOptimizer._backend_apply_gradients` as this fix was written
# against (sha256 of its source, 16 hex digits): its accumulate-or-update
# `cond` reaches `merge_call` in both (3.16 moved its EMA step into a method
# of its own). Another digest is code not seen: the fix steps aside, said
# once (an upstream fix, keras-team/keras#23592, would be one).
KNOWN = {"48d6e24d58039241": "3.15.1", "4de6fa4f3a26833f": "3.16.0.dev2026102704"}
_said = False


def upstream_known(*, warn_if_not: bool = False) -> bool:
    """Whether this Keras's `_backend_apply_gradients` is code the fix was
    written for."""
    global _said
    known = _source_digest() in KNOWN
    if not known and warn_if_not and not _said:
        _said = True
        warn(
            "kerascale's fix for gradient accumulation under tf.distribute "
            "(keras-team/keras#20582) was written for other versions of Keras's "
            "BaseOptimizer._backend_apply_gradients; not applied (Keras may have "
            "fixed it). If accumulation under a strategy fails, report it with "
            "your Keras version."
        )
    return known


@functools.cache
def _source_digest() -> str:
    """The digest of this Keras's source (read once a process: the file
    does not change under it)."""
    from keras.src.optimizers import base_optimizer

    source = inspect.getsource(base_optimizer.BaseOptimizer._backend_apply_gradients)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def unfix_distributed_accumulation(opt: Any) -> None:
    """Takes back `fix_distributed_accumulation`: Keras's own method again."""
    opt.__dict__.pop("_backend_apply_gradients", None)


def _distributed_apply_gradients(self: Any, grads: list, trainable_variables: list):
    """Keras's `_backend_apply_gradients` for accumulation under a
    tf.distribute strategy: the update-or-accumulate choice made in the
    cross-replica context.

    Keras decides with `ops.cond` in the replica context, and both branches
    reach `merge_call` (the gradient all-reduce, the accumulator update),
    which tf.distribute forbids inside control flow (keras-team/keras#20582:
    "merge_call called while defining a new graph"). The same fix Keras's
    own LossScaleOptimizer uses: `merge_call` first, `cond` in the
    cross-replica context, each branch run per replica with
    `call_for_each_replica`. The branches are Keras's own steps.
    """
    import tensorflow as tf
    from keras import ops

    k = self.gradient_accumulation_steps

    def update_step(grads, trainable_variables):
        acc = [
            self._accumulated_gradients[self._get_variable_index(v)]
            for v in trainable_variables
        ]
        grads = [(g + a) / k for g, a in zip(grads, acc, strict=True)]
        grads = self._clip_gradients(grads)
        self._apply_weight_decay(trainable_variables)
        self._backend_update_step(grads, trainable_variables, self.learning_rate)
        self._backend_reset_gradient_accumulators()

    def accumulate_step(grads, trainable_variables):
        acc = [
            self._accumulated_gradients[self._get_variable_index(v)]
            for v in trainable_variables
        ]
        self._backend_increment_gradient_accumulators(grads, acc)

    def cross_replica(distribution, grads, trainable_variables):
        is_update_step = (self._iterations + 1) % k == 0
        ops.cond(
            is_update_step,
            lambda: distribution.extended.call_for_each_replica(
                update_step, args=(grads, trainable_variables)
            ),
            lambda: distribution.extended.call_for_each_replica(
                accumulate_step, args=(grads, trainable_variables)
            ),
        )

    tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(grads, trainable_variables)
    )
    if self.use_ema:
        self._update_model_variables_moving_average(self._trainable_variables)


def _built_under_a_strategy(opt: Any) -> bool:
    """Whether the optimizer was built under a strategy of its own (not
    TensorFlow's default one, where Keras's path works)."""
    dist = getattr(opt, "_distribution_strategy", None)
    return dist is not None and type(dist).__name__ != "_DefaultDistributionStrategy"
