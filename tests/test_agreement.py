"""The agreement between workers (kerascale.apply.step_agreement) with two
workers as threads: a step's all-reduce is a barrier both must reach, and the
coordination service's key-value store is a dict (the seam). The real thing
runs in tests/test_multiworker.py."""

import threading
import time
import types

import pytest
import tensorflow as tf

from kerascale import _tf_compat as tfc
from kerascale.apply import step_agreement as agreement_lib


class FakeStore:
    """Write-once keys, blocking reads: what the coordination service does."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def set(self, key, value):
        with self.changed:
            if key in self.values:
                raise tfc.KV_TAKEN[0](None, None, f"{key} exists")
            self.values[key] = value
            self.changed.notify_all()

    def get(self, key, timeout):
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, timeout):
                raise tfc.KV_TIMEOUT[0](None, None, f"{key} timed out")
            return self.values[key]


@pytest.fixture
def store(monkeypatch):
    fake = FakeStore()
    monkeypatch.setattr(tfc, "kv_set", fake.set)
    monkeypatch.setattr(tfc, "kv_get", fake.get)
    monkeypatch.setattr(agreement_lib, "_POLL_SECONDS", 0.05)
    return fake


def run_workers(wishes, steps=12, finish=True):
    """Two workers train `steps` steps in lockstep (a barrier per step, like
    an all-reduce); `wishes[w][s]` is what worker w wants after step s. Returns
    each worker's [(step, kinds decided)] and what `finish` left."""
    barrier = threading.Barrier(2, timeout=20)
    agreements = [agreement_lib.Agreement("test", w, 2, timeout=20) for w in range(2)]
    decided, left, errors = [[], []], [None, None], []

    def work(w):
        try:
            for step in range(1, steps + 1):
                barrier.wait()  # the step's all-reduce
                for kind in wishes[w].get(step, ()):
                    agreements[w].want(kind)
                now = agreements[w].at_step(0, step - 1)
                # a second callback at the same step gets the same answer
                assert agreements[w].at_step(0, step - 1) == now
                if now:
                    decided[w].append((step, sorted(now)))
            if finish:
                left[w] = agreements[w].finish()
        except Exception as e:  # surfaced below
            errors.append(e)
            barrier.abort()
        finally:
            agreements[w].close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert not any(a._thread.is_alive() for a in agreements)  # nothing left
    return decided, left


def test_one_workers_wish_is_acted_on_by_both_at_the_next_step(store):
    decided, left = run_workers([{}, {4: ["save"]}])
    assert decided[0] == decided[1] == [(5, ["save"])]
    assert left == [set(), set()]


def test_wishes_at_once_on_both_are_decided_one_after_the_other(store):
    decided, _ = run_workers([{3: ["save"]}, {3: ["stop"]}])
    assert decided[0] == decided[1]
    kinds = [k for _, ks in decided[0] for k in ks]
    assert sorted(kinds) == ["save", "stop"]  # the overtaken wish came after
    steps = [s for s, _ in decided[0]]
    assert steps[0] == 4 and steps[1] > 4


def test_preemption_fulfils_every_other_wish(store):
    decided, _ = run_workers([{2: ["save"]}, {2: ["preempt", "stop"]}])
    assert decided[0] == decided[1]
    kinds = [k for _, ks in decided[0] for k in ks]
    # Whichever round came first, nothing is decided after the preemption:
    # its save and exit fulfil the other wishes.
    assert kinds[-1] == "preempt" and kinds.count("preempt") == 1, kinds
    assert "stop" not in kinds


def test_a_wish_at_the_last_step_reaches_every_worker_at_the_end(store):
    decided, left = run_workers([{}, {6: ["preempt"]}], steps=6)
    assert decided == [[], []]  # step 7 never came
    assert left == [{"preempt"}, {"preempt"}]


def test_unknown_kinds_are_refused(store):
    agreement = agreement_lib.Agreement("x", 0, 2, timeout=1)
    try:
        with pytest.raises(ValueError, match="unknown decision"):
            agreement.want("reboot")
    finally:
        agreement.close()
    assert not agreement._thread.is_alive()


class FakeService:
    """The seam under `_tf_compat.kv_get`: TensorFlow's eager context, whose
    wait for a key outlives a dead writer, and whose coordination service
    reports the tasks it lost (`get_task_states`)."""

    coordination_service = types.SimpleNamespace(
        coordinated_job_list=[types.SimpleNamespace(name="worker", num_tasks=2)]
    )

    def __init__(self):
        self.store, self.lost, self.unreachable = FakeStore(), None, False

    def set_config_key_value(self, key, value):
        self.store.set(key, value)

    def get_config_key_value(self, key, timeout_in_ms):
        return self.store.get(key, timeout_in_ms / 1000)

    def get_task_states(self, jobs):
        assert jobs == [("worker", 2)]
        if self.unreachable:
            raise tf.errors.UnavailableError(None, None, "connection reset")
        return [None, self.lost]


def test_a_wait_for_a_lost_workers_key_ends_when_the_service_reports_it(monkeypatch):
    """Worker 1 died before its share of an exchange (a checkpoint's random
    states at an epoch's end): worker 0's wait for that key ends with the
    error the coordination service reports for it, not after the run's
    exchange timeout (30 min by default). The real thing:
    test_multiworker.py's killed worker."""
    from tensorflow.python.eager import context

    service = FakeService()
    monkeypatch.setattr(context, "context", lambda: service)
    monkeypatch.setattr(tfc, "LOST_POLL_SECONDS", 0.05)
    monkeypatch.setattr(agreement_lib, "_POLL_SECONDS", 0.05)
    agreement = agreement_lib.Agreement("x", 0, 2, timeout=600)
    lost = tf.errors.UnavailableError(None, None, "task:1 heartbeat timeout")
    threading.Timer(0.3, lambda: setattr(service, "lost", lost)).start()
    began = time.monotonic()
    try:
        with pytest.raises(tf.errors.UnavailableError, match="heartbeat timeout"):
            agreement.gather("random", [1, 2])
    finally:
        agreement.close()
    assert time.monotonic() - began < 5
    # Alive, a worker that writes late is waited for, within the timeout.
    agreement = agreement_lib.Agreement("y", 0, 2, timeout=600)
    service.lost = None
    threading.Timer(0.3, service.store.set, ("y/gather/random/1", "[3]")).start()
    try:
        assert agreement.gather("random", [1, 2]) == [[1, 2], [3]]
    finally:
        agreement.close()
    # A service that cannot be asked for a moment is no lost worker: the wait
    # goes on, as TensorFlow's own would.
    agreement = agreement_lib.Agreement("z", 0, 2, timeout=600)
    service.unreachable = True
    threading.Timer(0.3, service.store.set, ("z/gather/random/1", "[4]")).start()
    try:
        assert agreement.gather("random", [1, 2]) == [[1, 2], [4]]
    finally:
        agreement.close()
