"""Training on several machines with TensorFlow's own engine.

Its design: docs/design/modules.md, `kerascale.apply.tensorflow.cluster`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kerascale import _keras_compat as keras_compat
from kerascale import _tf_compat as tfc
from kerascale import _validation
from kerascale.apply.model import core_optimizer
from kerascale.apply.tensorflow.resolvers import cluster_resolver
from kerascale.errors import ClusterConfigError, WorkerLostError, warn
from kerascale.plan import strategy as strategy_rules
from kerascale.sense import backend as backend_lib
from kerascale.sense.cluster import (
    ClusterInfo,
    check_trainable,
    detect_cluster,
)
from kerascale.sense.data_facts import UNSEEDED_SHUFFLE_ON_CLUSTER, unseeded_shuffle

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan
    from kerascale.sense.hardware import Hardware

logger = logging.getLogger("kerascale")

DEFAULT_WORKER_TIMEOUT = 60.0
# `import kerascale` joins the cluster unless this is "0" (or false, no, off).
AUTO_CONNECT_ENV = "KERASCALE_AUTO_CONNECT"
# worker_timeout for the join at import ("90", "2min"), read once at import.
WORKER_TIMEOUT_ENV = "KERASCALE_WORKER_TIMEOUT"


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """Seconds before the cluster gives up on a worker (see the module doc)."""

    heartbeat: float
    start: float
    exchange: float

    @classmethod
    def for_worker_timeout(cls, seconds: float) -> Timeouts:
        return cls(
            heartbeat=seconds,
            start=max(900.0, 15 * seconds),
            exchange=max(1800.0, 30 * seconds),
        )

    def describe(self) -> str:
        return (
            f"a worker silent for {_seconds(self.heartbeat)} is lost; all must "
            f"start within {_seconds(self.start)}; one exchange waits at most "
            f"{_seconds(self.exchange)}"
        )


@dataclasses.dataclass
class _Connection:
    strategy: Any
    timeouts: Timeouts
    source: str
    worker_id: int  # the index among training workers, the chief first
    num_workers: int
    rounds: int = 0
    at_import: bool = False  # joined by `import kerascale`


_connection: _Connection | None = None


def validate_timeout(worker_timeout: Any) -> Timeouts:
    """Checks `worker_timeout` (seconds > 0 or "2min") at the door."""
    seconds = _validation.duration(
        "worker_timeout",
        worker_timeout,
        accepted='a number of seconds > 0 or a string like "90s" or "2min"',
    )
    return Timeouts.for_worker_timeout(seconds)


def connection() -> _Connection | None:
    """The cluster this process joined, or None."""
    return _connection


def connect(
    worker_timeout: float | str = DEFAULT_WORKER_TIMEOUT,
    *,
    environ: Mapping[str, str] | None = None,
) -> Any:
    """Joins the cluster the environment describes, if there is one.

    Call it at the top of a training script, before the model and the data
    are built: TensorFlow sets up communication between workers only before
    it runs anything. On one machine it does nothing and returns None, so the
    same script runs everywhere.

    Args:
        worker_timeout: Seconds (or "2min") a worker may stay silent before
            the others stop with `WorkerLostError`. The start and exchange
            limits scale with it (see `kerascale.apply.tensorflow.cluster`).
            Defaults to 60.
        environ: The environment to read; defaults to `os.environ`.

    Returns:
        The `tf.distribute.MultiWorkerMirroredStrategy`, or None when the
        environment describes no cluster of two or more workers.

    Raises:
        ClusterConfigError: For a malformed TF_CONFIG, CLUSTER_SPEC or SLURM
            environment (the message names the field), or when TensorFlow has
            already started in this process.
        UnsupportedError: For a parameter-server or evaluator task.

    Example:

    >>> import kerascale
    >>> kerascale.connect_cluster()   # first, before building anything
    >>> model = build_model()
    >>> kerascale.fit(model, ds, epochs=10)
    """
    global _connection
    timeouts = validate_timeout(worker_timeout)
    env = os.environ if environ is None else environ
    info = detect_cluster(env)
    if info is None or (info.error is None and not info.is_multi_worker):
        return None
    check_trainable(info)
    if _connection is not None:
        if _connection.timeouts != timeouts:
            how = (
                f"kerascale joined it at import: set {WORKER_TIMEOUT_ENV}="
                f"{timeouts.heartbeat:g} in the environment instead"
                if _connection.at_import
                else "timeouts are set once, at the start of the program"
            )
            warn(
                "Already connected to the cluster with worker_timeout="
                f"{_seconds(_connection.timeouts.heartbeat)}; worker_timeout="
                f"{_seconds(timeouts.heartbeat)} is ignored ({how})."
            )
        return _connection.strategy
    if tfc.tf_started():
        raise ClusterConfigError(
            f"{info.source} describes a cluster of {info.num_workers} workers, "
            "but TensorFlow has already started in this process, and it can "
            "only join a cluster before it runs anything. Import kerascale at "
            "the top of your script, before building the model or the data: "
            "the import joins the cluster (with KERASCALE_AUTO_CONNECT=0, call "
            "kerascale.connect_cluster() there instead). Or pass "
            "strategy='mirrored' to train on this machine alone."
        )
    _connection = _join(info, env, timeouts)
    return _connection.strategy


def join_at_import(environ: Mapping[str, str] | None = None) -> Any:
    """What `import kerascale` does: joins the cluster the environment
    describes, so that a script needs no extra line.

    It joins only when all of these hold, and otherwise does nothing (a
    notebook, a single-worker job, a malformed description, which `fit`
    then reports): `KERASCALE_AUTO_CONNECT` is not "0"; TF_CONFIG, Vertex AI's
    CLUSTER_SPEC or SLURM under `srun` describes two or more training
    workers and this process is one of them (chief or worker); and
    TensorFlow has not started yet. Joining waits until every worker has
    joined, as creating `MultiWorkerMirroredStrategy` does.

    Returns:
        The strategy, or None when it did not join.
    """
    env = os.environ if environ is None else environ
    if not backend_lib.traits().joins_tf_clusters:
        return None  # a TensorFlow cluster; JAX's processes join otherwise
    if env.get(AUTO_CONNECT_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    info = detect_cluster(env)
    if info is None or not info.is_multi_worker or _connection is not None:
        return None
    if info.task_type not in ("chief", "master", "worker"):
        return None  # fit says what to do with a parameter server or evaluator
    if info.source == "SLURM" and not env.get("SLURM_STEP_NODELIST"):
        return None  # not under srun: fit says to use it
    timeouts = timeouts_from_env(env)
    if tfc.tf_started():
        return None  # fit says to import kerascale first
    strategy = connect(timeouts.heartbeat, environ=env)
    if _connection is not None:
        _connection.at_import = True
    return strategy


def timeouts_from_env(env: Mapping[str, str]) -> Timeouts:
    """The timeouts of `KERASCALE_WORKER_TIMEOUT` (60 s by default), for a
    join at import (TensorFlow's cluster, or JAX's processes)."""
    raw = env.get(WORKER_TIMEOUT_ENV)
    try:
        return validate_timeout(_number_or_text(raw or DEFAULT_WORKER_TIMEOUT))
    except ValueError:
        raise ClusterConfigError(
            f"{WORKER_TIMEOUT_ENV} must be a number of seconds > 0 or a string "
            f'like "90s" or "2min". Received: {WORKER_TIMEOUT_ENV}={raw!r}'
        ) from None


def _number_or_text(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _join(info: ClusterInfo, env: Mapping[str, str], timeouts: Timeouts) -> _Connection:
    """Creates the strategy that joins the cluster, with `timeouts`."""
    import tensorflow as tf

    resolver = cluster_resolver(info, env)
    # TensorFlow's coordination service with our timeouts: its heartbeats
    # find a lost worker (MultiWorkerMirroredStrategy would otherwise set it
    # up with a 10 s heartbeat and no limit on the start).
    tfc.configure_coordination(
        resolver.cluster_spec(), heartbeat=timeouts.heartbeat, start=timeouts.start
    )
    communication = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeouts.exchange
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=communication
    )
    keras_compat.apply()
    worker_id, num_workers = tfc.worker_position(strategy)
    connection = _Connection(
        strategy=strategy,
        timeouts=timeouts,
        source=info.source,
        worker_id=worker_id,
        num_workers=num_workers,
    )
    logger.info(
        "Joined the %s cluster as worker %d of %d (%s).",
        info.source,
        connection.worker_id,
        connection.num_workers,
        timeouts.describe(),
    )
    return connection


def join_if_wanted(hw: Hardware, requested: Any, worker_timeout: Any) -> bool:
    """Joins the cluster when `requested` trains across it (`fit`'s first
    step); returns whether it does. `worker_timeout=None` keeps an earlier
    connection's timeouts, else uses the default."""
    if not strategy_rules.wants_cluster(hw, requested):
        return False
    if worker_timeout is not None or _connection is None:
        connect(DEFAULT_WORKER_TIMEOUT if worker_timeout is None else worker_timeout)
    return True


def joined_by(strategy: Any) -> bool:
    """Whether `strategy` is the joined cluster's."""
    return _connection is not None and strategy is _connection.strategy


def tf_seed() -> int | None:
    """TensorFlow's global seed, or None when none is set."""
    return tfc.global_seed()


def start_alike(model: Any, strategy: Any, plan: Plan, data: Any, x: Any) -> Any:
    """Under the joined cluster's strategy: gives every worker the chief's
    weights (and optimizer state) and TensorFlow seed, and returns `plan`
    with a warning when the dataset shuffles without a seed. Elsewhere it
    returns `plan` untouched."""
    if not joined_by(strategy):
        return plan
    optimizer = core_optimizer(model.optimizer)
    broadcast_variables(
        [*model.weights, *getattr(optimizer, "variables", [])], strategy
    )
    share_tf_seed()
    if data.kind == "dataset" and unseeded_shuffle(x):
        warning = UNSEEDED_SHUFFLE_ON_CLUSTER
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, warning))
    return plan


def exchange(value: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every worker's `value` (JSON-able), in worker order (the chief first).

    All workers must call it the same number of times, in the same order.
    """
    conn = _connection
    if conn is None:
        raise RuntimeError("exchange() needs connect() first.")
    conn.rounds += 1
    key = f"kerascale/round{conn.rounds}/worker"
    tfc.kv_set(f"{key}{conn.worker_id}", json.dumps(dict(value)))
    return [
        json.loads(tfc.kv_get(f"{key}{i}", conn.timeouts.start))
        for i in range(conn.num_workers)
    ]


def broadcast_variables(variables: list[Any], strategy: Any) -> None:
    """Gives every worker the chief's values of `variables`.

    Variables created under the strategy start equal (TensorFlow broadcasts
    their initial values), but kerascale re-creates your model and copies in
    your weights, which may differ on each worker (unseeded initialisers).
    """
    import tensorflow as tf

    variables = [v for v in variables if v.dtype != "string"]
    if not variables:
        return
    values = [
        tf.convert_to_tensor(v.value if hasattr(v, "value") else v) for v in variables
    ]

    def from_first_replica():
        ctx = tf.distribute.get_replica_context()
        first = tf.equal(ctx.replica_id_in_sync_group, 0)
        sent = []
        for value in values:
            wide = tf.cast(value, tf.float64)
            sent.append(tf.where(first, wide, tf.zeros_like(wide)))
        return ctx.all_reduce("SUM", sent)

    reduced = strategy.run(tf.function(from_first_replica))
    for variable, result, value in zip(variables, reduced, values, strict=True):
        local = strategy.experimental_local_results(result)[0]
        variable.assign(tf.cast(local, value.dtype))


# Words in TensorFlow's messages that say which peer went away, best first.
_TELLING = ("is down", "unhealthy", "heartbeat", "aborted")


def translate_error(e: BaseException) -> WorkerLostError | None:
    """`WorkerLostError` for TensorFlow's errors that mean a peer is gone."""
    if _connection is None:
        return None
    import tensorflow as tf

    lost = (
        tf.errors.UnavailableError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.AbortedError,
    )
    if _connection is None or not isinstance(e, lost):
        return None
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    telling = [ln for word in _TELLING for ln in lines if word in ln]
    first = (telling or lines or [type(e).__name__])[0]
    t = _connection.timeouts
    return WorkerLostError(
        f"Training stopped: another worker of the {_connection.source} cluster "
        f"died or stopped responding ({type(e).__name__}: {first[:300]}). "
        f"A silent worker is declared lost after worker_timeout="
        f"{_seconds(t.heartbeat)}. Restart every worker: with checkpoint_dir, "
        "training resumes from the last checkpoint."
    )


def _seconds(s: float) -> str:
    if s >= 120 and s % 60 == 0:
        return f"{int(s // 60)} min"
    return f"{s:g} s"


def share_tf_seed() -> int:
    """Sets TensorFlow's global seed to the chief's on every worker, and
    returns it. Data is split between workers after each has read the whole
    pipeline, so an unseeded shuffle made by Keras (arrays with
    `shuffle=True`) must shuffle alike everywhere, or an epoch would see some
    samples twice and miss others."""
    import random

    import tensorflow as tf

    own = tfc.global_seed()
    if own is None:
        own = random.SystemRandom().randrange(2**31)
    seed = int(exchange({"seed": int(own)})[0]["seed"])
    tf.random.set_seed(seed)
    return seed
