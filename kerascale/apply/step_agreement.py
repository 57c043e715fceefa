"""Decisions that every worker of a cluster takes at the same step.

Its design: docs/design/modules.md, `kerascale.apply.step_agreement`.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import Any, Protocol

from kerascale import _tf
from kerascale import _tf_compat as tfc
from kerascale.sense import backend as backend_lib

logger = logging.getLogger("kerascale")

KINDS = ("save", "stop", "preempt")
# The watcher waits this long per request, then looks whether the run is over.
_POLL_SECONDS = 1.0


class KeyValueStore(Protocol):
    """The coordination service's key-value store, as `_tf_compat`
    (TensorFlow) or `_jax_compat` (JAX) reads it. A wait for a key ends when
    the service loses the worker that was to write it (`_tf_compat.kv_get`;
    JAX's client ends the process itself)."""

    KV_TAKEN: tuple[type[BaseException], ...]  # the key was written before
    KV_TIMEOUT: tuple[type[BaseException], ...]  # a wait ran out
    KV_ERRORS: tuple[type[BaseException], ...]  # the service failed

    def kv_set(self, key: str, value: str) -> None: ...

    def kv_get(self, key: str, timeout: float | None) -> str: ...


class Agreement:
    """The rounds of decisions of one `fit` call on one worker.

    Each callback that needs agreed decisions calls `want(kind)` for its own
    wish and `at_step(epoch, batch)` at every training batch's end; the
    latter returns the kinds every worker acts on at that step.
    """

    def __init__(
        self,
        prefix: str,
        worker_id: int,
        num_workers: int,
        timeout: float,
        store: KeyValueStore = tfc,
    ):
        self.store = store
        self.prefix = prefix
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.timeout = timeout
        self.wishes: set[str] = set()
        self._count = 0  # training batch ends seen in this run
        self._boundary: tuple[int, int] | None = None
        self._now: frozenset[str] = frozenset()
        self._pending: dict[str, Any] | None = None  # decided, step not reached
        self._round = 1  # the round the next proposal goes in
        self._received: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._finished: set[str] | None = None
        self._thread = threading.Thread(
            target=self._watch, name="kerascale-agreement", daemon=True
        )
        self._thread.start()

    # --- the training thread ------------------------------------------------

    def want(self, kind: str) -> None:
        """Raises this worker's wish for `kind`, proposed at the next step."""
        if kind not in KINDS:
            raise ValueError(f"unknown decision {kind!r}")
        self.wishes.add(kind)

    def at_step(self, epoch: int, batch: int) -> frozenset[str]:
        """The kinds decided for the training step that just ended (the same
        on every worker); proposes this worker's wishes for the next step.
        Several callbacks may call it at one step: they get the same answer."""
        if (epoch, batch) != self._boundary:
            self._boundary = (epoch, batch)
            self._count += 1
            self._now = frozenset()
            pending = self._next_decision()
            if pending is not None and pending["step"] <= self._count:
                if pending["step"] < self._count:  # cannot happen; say so if it does
                    logger.warning(
                        "Decision %r for step %d reached at step %d.",
                        pending["kind"],
                        pending["step"],
                        self._count,
                    )
                self._pending = None
                self._now = frozenset([pending["kind"]])
                self.wishes -= _satisfied_by(pending["kind"])
        if self.wishes and self._next_decision() is None and not self._closed.is_set():
            self._propose()
        return self._now

    def finish(self) -> set[str]:
        """The run's last round, at its end, on every worker (all must call
        it): what any worker still wishes, or proposed for a step that never
        came. Then closes. Idempotent."""
        if self._finished is not None:
            return self._finished
        left = set(self.wishes)
        pending = self._next_decision()
        if pending is not None and pending["step"] > self._count:
            left.add(pending["kind"])
        try:
            self.store.kv_set(
                f"{self.prefix}/final{self.worker_id}", json.dumps(sorted(left))
            )
            for i in range(self.num_workers):
                left.update(json.loads(self._get(f"{self.prefix}/final{i}")))
        finally:
            self.close()
        self._finished = left
        return left

    def from_chief(self, name: str, value: Any = None) -> Any:
        """The chief's `value` (JSON-able) for `name`, on every worker; the
        chief passes it, the others wait for it. Once per name and run."""
        key = f"{self.prefix}/chief/{name}"
        if self.worker_id == 0:
            self.store.kv_set(key, json.dumps(value))
            return value
        return json.loads(self._get(key))

    def gather(self, name: str, value: Any) -> list[Any] | None:
        """Every worker's `value` (JSON-able) for `name`, in worker order, on
        the chief; None on the others. Every worker calls it (at the same
        point of the run, once per name and run); the chief waits for all."""
        key = f"{self.prefix}/gather/{name}"
        self.store.kv_set(f"{key}/{self.worker_id}", json.dumps(value))
        if self.worker_id != 0:
            return None
        return [json.loads(self._get(f"{key}/{i}")) for i in range(self.num_workers)]

    def _get(self, key: str) -> str:
        """Another worker's `key`, waited for at most the run's exchange
        timeout."""
        return self.store.kv_get(key, self.timeout)

    def close(self) -> None:
        """Stops the watcher thread (idempotent; within `_POLL_SECONDS`)."""
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_POLL_SECONDS + 1)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # --- proposing -----------------------------------------------------------

    def _propose(self) -> None:
        kind = "preempt" if "preempt" in self.wishes else sorted(self.wishes)[0]
        decision = {"kind": kind, "step": self._count + 1, "by": self.worker_id}
        n = self._round
        try:
            self.store.kv_set(self._key(n), json.dumps(decision))
        except self.store.KV_TAKEN:
            # Another worker proposed in this round first: every worker acts
            # on its decision, then this one proposes again if still wanted.
            self._record(n, json.loads(self._get(self._key(n))))
            self._next_decision()
            return
        logger.info("Worker %d proposed %r at step %d.", *decision.values())
        self._record(n, decision)
        self._next_decision()
        for i in range(self.num_workers):  # every worker knows before step + 1
            self._get(f"{self._key(n)}/ack{i}")

    def _next_decision(self) -> dict[str, Any] | None:
        """The oldest decision received and not yet acted on, or None."""
        if self._pending is None:
            with self._lock:
                if self._received:
                    n = min(self._received)
                    self._pending = self._received.pop(n)
                    self._round = max(self._round, n + 1)
        return self._pending

    def _record(self, n: int, decision: dict[str, Any]) -> None:
        with self._lock:
            if n >= self._round and decision.get("kind") in KINDS:
                self._received.setdefault(n, decision)

    def _key(self, n: int) -> str:
        return f"{self.prefix}/round{n}"

    # --- the watcher thread --------------------------------------------------

    def _watch(self) -> None:
        n = 1
        while not self._closed.is_set():
            try:
                raw = self.store.kv_get(self._key(n), _POLL_SECONDS)
            except self.store.KV_TIMEOUT:
                continue
            except self.store.KV_ERRORS:
                return  # the cluster is gone; the training thread finds out
            self._record(n, json.loads(raw))
            try:
                self.store.kv_set(f"{self._key(n)}/ack{self.worker_id}", "1")
            except self.store.KV_ERRORS:
                return
            n += 1


def _satisfied_by(kind: str) -> set[str]:
    """The wishes a decision of `kind` fulfils when every worker acts on it."""
    return set(KINDS) if kind == "preempt" else {kind}


# One agreement per `fit` call: the callbacks of one run share it.
_runs: weakref.WeakKeyDictionary[Any, tuple[Any, Agreement]] = (
    weakref.WeakKeyDictionary()
)
_fits = 0  # agreements made in this process: the same count on every worker


def _position(model: Any) -> tuple[int, int, Any]:
    """(this worker's index, the number of workers, the store): under a
    `MultiWorkerMirroredStrategy` on TensorFlow, among JAX's joined
    processes on JAX; (0, 1, None) alone."""
    if not backend_lib.traits().joins_tf_clusters:
        from kerascale import _jax_compat
        from kerascale.apply.jax import cluster as jax_cluster

        count, index = jax_cluster.processes()
        return index, count, _jax_compat
    strategy = getattr(model, "distribute_strategy", None)
    if not _tf.is_instance(strategy, "distribute", "MultiWorkerMirroredStrategy"):
        return 0, 1, None
    return (*tfc.worker_position(strategy), tfc)


class Run(Protocol):
    """The `fit` call an agreement serves (`callbacks._base.FitRun`)."""

    def alive(self) -> bool: ...


def for_run(model: Any, run: Run) -> Agreement | None:
    """The agreement of the `fit` call `run` serves, made at its first
    request; None unless `model` trains under a `MultiWorkerMirroredStrategy`
    of two or more workers (joined by kerascale or not), or in two or more
    joined JAX processes."""
    from kerascale.apply.tensorflow import cluster

    global _fits
    worker_id, num_workers, store = _position(model)
    if num_workers < 2:
        return None
    held = _runs.get(model)
    if held is not None:
        owner, agreement = held
        if owner.alive() and not agreement.closed:
            return agreement
        agreement.close()
    _fits += 1
    connection = cluster.connection()
    timeouts = (
        connection.timeouts
        if connection is not None
        else cluster.Timeouts.for_worker_timeout(cluster.DEFAULT_WORKER_TIMEOUT)
    )
    agreement = Agreement(
        f"kerascale/agree/fit{_fits}",
        worker_id,
        num_workers,
        timeouts.exchange,
        store,
    )
    _runs[model] = (run, agreement)
    return agreement
