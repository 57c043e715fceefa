"""`Prefetch` (the host loader on JAX): the same batches in the same order as
plain `fit`, the host's time hidden behind the step's, nothing left behind,
and a resume under a `FaultTolerantBackup` in either order of callbacks."""

import random
import threading
import time
import warnings

import keras
import numpy as np
import pytest
from conftest import dense_model, toy_data

import kerascale
from kerascale.callbacks import FaultTolerantBackup, Prefetch
from kerascale.plan.data_changes import DataChanges

# Tests marked nightly one by one: Keras's side only (CONTRIBUTING.md).


class Batches(keras.utils.PyDataset):
    """Batches of 16 of (x, y); `delay` seconds of host work per batch, and
    a ValueError at batch `fail_at`."""

    def __init__(self, x, y, delay=0.0, fail_at=None):
        super().__init__()
        self.x, self.y, self.delay, self.fail_at = x, y, delay, fail_at

    def __len__(self):
        return len(self.x) // 16

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError(f"bad batch {i}")
        time.sleep(self.delay)
        return self.x[i * 16 : (i + 1) * 16], self.y[i * 16 : (i + 1) * 16]


def endless(x, y):
    i = 0
    while True:
        s = slice((i * 16) % len(x), (i * 16) % len(x) + 16)
        yield x[s], y[s]
        i += 1


def weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def train(data, callbacks=(), seed=3, **kwargs):
    """The model after 3 epochs of shuffled training from one random state."""
    model = dense_model()  # seeds Python's and NumPy's random too
    np.random.seed(seed)
    random.seed(seed)
    model.fit(*data, epochs=3, verbose=0, callbacks=list(callbacks), **kwargs)
    return model


def no_reader_threads():
    return not [t for t in threading.enumerate() if t.name == "kerascale-prefetch"]


@pytest.mark.once  # plain fit and the callback: one device
@pytest.mark.parametrize("kind", ["arrays", "pydataset", "generator"])
@pytest.mark.nightly
def test_the_same_batches_in_the_same_order_as_plain_fit(kind):
    x, y = toy_data(n=160)
    if kind == "arrays":
        data, kwargs = (x, y), {"batch_size": 16, "shuffle": True}
    elif kind == "pydataset":
        data, kwargs = (Batches(x, y),), {"shuffle": True}
    else:
        data, kwargs = None, {"steps_per_epoch": 7}
    if kind == "generator":
        plain = train((endless(x, y),), **kwargs)
        loaded = train((endless(x, y),), [Prefetch()], **kwargs)
    else:
        plain = train(data, **kwargs)
        loaded = train(data, [Prefetch()], **kwargs)
    # SGD on shuffled batches: the weights are the order's fingerprint.
    for a, b in zip(weights(plain), weights(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    if kind != "generator":  # another order trains other weights
        # (unshuffled: from Keras 3.16 the global seed orders nothing,
        # keras-team/keras#23046)
        other = train(data, **{**kwargs, "shuffle": False})
        assert any(
            not np.array_equal(a, b)
            for a, b in zip(weights(plain), weights(other), strict=True)
        )
    assert no_reader_threads()
    assert "Prefetch" not in repr(loaded.train_function)


@pytest.mark.once  # plain fit and the callback: one device
def test_the_hosts_time_is_hidden_behind_the_steps():
    """Each batch takes 40 ms of host work and each step 40 ms (a callback
    sleeping stands for the device). With Prefetch the next batches are read
    while a step runs: a read's 40 ms and a step's run at the same time.
    Plain fit reads each batch between two steps, in the training thread.
    What this checks is the overlap itself, from the reads' and steps' own
    clocks, not a speed threshold: the speed it buys is
    benchmarks/jax_loader.py's (a best-of-3 timing here took 13 s a lane).
    Here: no read overlaps a step plain; 11 or 12 of 12 with Prefetch, also
    beside two busy loops. (Counting only the reads that began inside a
    step's sleep gave 10 idle and 6 in the suite's two-at-a-time lane: a
    read begins when the training thread takes a batch, which is just
    before the step begins.)"""
    x, y = toy_data(n=16 * 12)
    reads, steps = [], []

    class Timed(Batches):
        def __getitem__(self, i):
            began = time.perf_counter()
            batch = super().__getitem__(i)
            reads.append((began, time.perf_counter()))
            return batch

    class Device(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            began = time.perf_counter()
            time.sleep(0.04)
            steps.append((began, time.perf_counter()))

    def overlapped(callbacks):
        """How many of an epoch's reads ran, in part, while a step ran, in
        the second epoch of a model (the first compiles its step)."""
        model, data = dense_model(), Timed(x, y, delay=0.04)
        for _ in range(2):
            reads.clear()
            steps.clear()
            model.fit(data, epochs=1, verbose=0, callbacks=[Device(), *callbacks])
        assert len(steps) == 12, steps
        return sum(any(r0 < s1 and s0 < r1 for s0, s1 in steps) for r0, r1 in reads)

    assert overlapped([]) == 0
    assert overlapped([Prefetch()]) >= 8  # of 12
    assert no_reader_threads()


@pytest.mark.once  # plain fit and the callback: one device
@pytest.mark.nightly
def test_an_error_in_the_data_reaches_the_user_as_in_plain_fit_and_nothing_stays():
    x, y = toy_data(n=160)
    model = dense_model()
    before = model.train_function
    with pytest.raises(ValueError, match="bad batch 4"):
        model.fit(Batches(x, y, fail_at=4), epochs=1, verbose=0, callbacks=[Prefetch()])
    time.sleep(0.5)  # the fit-watch thread releases within 0.2 s
    assert no_reader_threads()
    # Keras's own train function, whatever this Keras names it
    # (iterator_step up to 3.15, a lambda of _make_function from 3.16).
    function = model.train_function
    assert function is before or function.__module__.startswith("keras.src.")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # trains on as plain


class Spy(keras.callbacks.Callback):
    """A callback with on_train_batch_end (Keras then waits on each step),
    which notes what trains each step."""

    def on_train_batch_begin(self, batch, logs=None):
        self.function = self.model.train_function

    def on_train_batch_end(self, batch, logs=None):
        pass


class Quiet(Spy):
    # Keras runs its on_train_batch_end on a thread pool, not waiting.
    async_safe = True


@pytest.mark.nightly
def test_kerascale_fit_reads_ahead_where_a_callback_waits_on_each_step():
    x, y = toy_data(n=160)
    spy = Spy()
    history = kerascale.fit(
        dense_model(), x, y, batch_size=16, epochs=1, verbose=0, callbacks=[spy]
    )
    assert history.plan.data_changes.read_ahead
    assert history.plan.reasons["data_changes"].code == "data.read_ahead"
    assert "Prefetch" in repr(spy.function)
    assert no_reader_threads()
    # Keras dispatches steps ahead, and reads meanwhile: nothing to add.
    quiet = Quiet()
    kerascale.fit(
        dense_model(), x, y, batch_size=16, epochs=1, verbose=0, callbacks=[quiet]
    )
    assert "Prefetch" not in repr(quiet.function)
    off = kerascale.fit(
        dense_model(),
        x,
        y,
        batch_size=16,
        epochs=1,
        verbose=0,
        optimize_data=False,
        callbacks=[Spy()],
    )
    assert off.plan.data_changes == DataChanges()


@pytest.mark.once  # plain fit and the callback: one device
@pytest.mark.parametrize("prefetch_first", [True, False])
@pytest.mark.nightly
def test_a_resume_under_a_backup_is_exact_in_either_order(tmp_path, prefetch_first):
    x, y = toy_data(n=160)
    reference = train((x, y), batch_size=16)

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 13:
                raise KeyboardInterrupt

    def callbacks(*extra):
        backup = FaultTolerantBackup(tmp_path, save_freq=2, verbose=0)
        pair = [Prefetch(), backup] if prefetch_first else [backup, Prefetch()]
        return [*pair, *extra]

    with pytest.raises(KeyboardInterrupt):
        train((x, y), callbacks(Stop()), batch_size=16)
    time.sleep(0.5)  # a plain fit that raised: the lease goes within 0.2 s
    with warnings.catch_warnings():
        warnings.simplefilter("error", kerascale.KerascaleWarning)
        resumed = train((x, y), callbacks(), seed=99, batch_size=16)
    for a, b in zip(weights(reference), weights(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    assert no_reader_threads()


@pytest.mark.once  # plain fit and the callback: one device
def test_depth_is_validated():
    with pytest.raises(ValueError, match="depth"):
        Prefetch(depth=0)


@pytest.mark.once  # plain fit and the callback: one device
@pytest.mark.nightly
def test_a_fast_input_goes_back_to_the_callers_thread_in_order():
    """A thread costs a handoff per batch; where reading takes less, the
    reader hands back what it read, in order, and reads inline."""
    from kerascale.apply.jax.reader import Reader

    fast = Reader(iter(range(100)), depth=2)
    assert list(fast) == list(range(100))
    # 8 handed over, then what the thread held when told (up to depth + 1).
    assert fast.inline and 8 <= fast.inline_at <= 8 + 2 + 1

    def slow():
        for i in range(20):
            time.sleep(0.003)
            yield i

    threaded = Reader(slow(), depth=2)
    assert list(threaded) == list(range(20))
    assert not threaded.inline and threaded.read_count == 20
    threaded.close()
    fast.close()
