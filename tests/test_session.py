"""One owner of every change: whatever kerascale installs for a run is undone
however the run ends (an exception from any callback hook, KeyboardInterrupt),
in `kerascale.fit` at once, and in a plain `model.fit` (where Keras skips
`on_train_end` when `fit` raises) by the time anything could notice.

After each failed run: the SIGTERM handler, `model.train_function`, the
profiler, the global dtype policy, Keras's seed state and Python's and NumPy's
random state are what they were before, and a later plain `fit` on other data
trains exactly like a fresh copy of the model."""

import os
import random
import signal
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from realworld import Widened

import kerascale
from kerascale import _keras_compat as keras_compat
from kerascale.apply.session import Session
from kerascale.callbacks import (
    FaultTolerantBackup,
    ProfileWindow,
    Throughput,
    TimeBudget,
)
from kerascale.callbacks._input_position import Wrapped

HOOKS = [
    ("on_train_begin", None, RuntimeError),
    ("on_epoch_begin", 1, RuntimeError),
    ("on_train_batch_end", 2, RuntimeError),
    ("on_epoch_end", 0, RuntimeError),
    ("on_train_batch_end", 3, KeyboardInterrupt),
]


class Raise(keras.callbacks.Callback):
    """Raises `error` from `hook` when its argument is `when` (any, if None)."""

    def __init__(self, hook, when, error):
        super().__init__()
        self.hook, self.when, self.error = hook, when, error

    def _maybe(self, hook, value):
        if hook == self.hook and (self.when is None or value == self.when):
            raise self.error(f"raised from {hook}")

    def on_train_begin(self, logs=None):
        self._maybe("on_train_begin", None)

    def on_epoch_begin(self, epoch, logs=None):
        self._maybe("on_epoch_begin", epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._maybe("on_train_batch_end", batch)

    def on_epoch_end(self, epoch, logs=None):
        self._maybe("on_epoch_end", epoch)


def model(seed=7):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    outputs = keras.layers.Dense(1)(h)
    m = keras.Model(inputs, outputs)
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return m


def data(seed, n=64, batch=8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def process_state():
    generator = keras_compat.existing_global_seed_generator()
    return {
        "sigterm": signal.getsignal(signal.SIGTERM),
        "policy": keras.config.dtype_policy().name,
        "seed generator": generator,
        "seed state": None if generator is None else generator.state.numpy(),
        "python random": random.getstate(),
        "numpy random": np.random.get_state(),
    }


def assert_same_state(before, after):
    assert after["sigterm"] is before["sigterm"]
    assert after["policy"] == before["policy"]
    assert after["seed generator"] is before["seed generator"]
    if before["seed state"] is not None:
        np.testing.assert_array_equal(after["seed state"], before["seed state"])
    assert after["python random"] == before["python random"]
    b, a = before["numpy random"], after["numpy random"]
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def profiler_running(tmp_path):
    try:
        tf.profiler.experimental.start(str(tmp_path / "probe-profiler"))
    except Exception:
        return True
    tf.profiler.experimental.stop(save=False)
    return False


def trains_like_a_fresh_copy(trained):
    """A later plain fit on other data gives the same weights as a fresh
    model holding the same weights (no stale wrapper, skip or epoch)."""
    twin = model(seed=99)
    twin.set_weights(trained.get_weights())
    other = data(seed=5)
    updates = int(trained.optimizer.iterations)
    trained.fit(other, epochs=2, verbose=0)
    twin.fit(other, epochs=2, verbose=0)
    assert int(trained.optimizer.iterations) - updates == 16  # 2 epochs of 8
    for a, b in zip(trained.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert type(trained.train_function) is not Wrapped


@pytest.fixture
def sigterm_seen():
    """A Python SIGTERM handler that records, installed for the test."""
    seen = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGTERM, original)


def send_sigterm_to_self(seen):
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100):  # Python runs the handler at the next bytecode
        if seen:
            break
        time.sleep(0.01)
    assert seen == [signal.SIGTERM]


@pytest.mark.parametrize("hook, when, error", HOOKS)
def test_plain_fit_leaves_nothing_behind(tmp_path, sigterm_seen, hook, when, error):
    m = model()
    before = process_state()
    callbacks = [
        FaultTolerantBackup(tmp_path / "ckpt", save_freq=2, verbose=0),
        TimeBudget("1h"),
        Throughput(8, tmp_path / "logs"),
        ProfileWindow(tmp_path / "logs", start_step=2, stop_step=6),
        Raise(hook, when, error),  # last: the others have run their hook
    ]
    with pytest.raises(error):
        m.fit(data(seed=1), epochs=3, verbose=0, callbacks=callbacks)
    # Keras called no on_train_end: each change is inert, and the profiler's
    # watch stops the trace within a fraction of a second.
    for _ in range(50):
        if not profiler_running(tmp_path):
            break
        time.sleep(0.1)
    assert not profiler_running(tmp_path)
    # A SIGTERM now reaches the handler that was there before, which is then
    # installed again.
    send_sigterm_to_self(sigterm_seen)
    assert_same_state(before, process_state())  # the recorder is back in place
    trains_like_a_fresh_copy(m)


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("hook, when, error", HOOKS)
def test_kerascale_fit_undoes_everything_at_once(
    tmp_path, sigterm_seen, precision, hook, when, error
):
    m = model()
    before = process_state()
    function_before = m.train_function
    with pytest.raises(error):
        kerascale.fit(
            m,
            data(seed=1),
            epochs=3,
            batch_size=16,
            accumulation_steps=2,  # changes the user's model's optimizer
            precision=precision,  # float32: the user's model itself trains
            strategy="default",
            optimize_data=False,
            checkpoint_dir=tmp_path / "ckpt",
            checkpoint_freq=2,
            log_dir=tmp_path / "logs",
            profile=(2, 6),
            time_budget="1h",
            verbose=0,
            callbacks=[Raise(hook, when, error)],
        )
    assert_same_state(before, process_state())  # at once, the handler too
    assert not profiler_running(tmp_path)
    if precision == "mixed_bfloat16":
        assert m.train_function is function_before  # a copy trained
    assert type(m.train_function) is not Wrapped
    assert not m.optimizer.gradient_accumulation_steps
    assert float(m.optimizer.learning_rate) == pytest.approx(0.05)
    send_sigterm_to_self(sigterm_seen)
    trains_like_a_fresh_copy(m)


def test_a_run_interrupted_while_skipping_leaves_later_fits_whole(tmp_path):
    """Resuming skips the steps already applied; a run that raises while
    skipping must not make a later plain fit skip anything."""
    m = model()
    directory = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        m.fit(
            data(seed=1),
            epochs=1,
            verbose=0,
            callbacks=[
                FaultTolerantBackup(directory, save_freq=1, verbose=0),
                Raise("on_train_batch_end", 4, RuntimeError),
            ],
        )
    # The rerun resumes at step 5 and raises while still skipping steps 1-5.
    with pytest.raises(RuntimeError):
        m.fit(
            data(seed=1),
            epochs=1,
            verbose=0,
            callbacks=[
                FaultTolerantBackup(directory, save_freq=1, verbose=0),
                Raise("on_train_batch_end", 1, RuntimeError),
            ],
        )
    iterations = int(m.optimizer.iterations)
    m.fit(data(seed=5), epochs=1, verbose=0)
    assert int(m.optimizer.iterations) == iterations + 8  # all 8 updates
    trains_like_a_fresh_copy(m)


def test_a_sigterm_with_no_training_running_reaches_the_previous_handler(
    tmp_path, sigterm_seen
):
    backup = FaultTolerantBackup(tmp_path / "ckpt", verbose=0)
    model().fit(data(seed=1), epochs=1, verbose=0, callbacks=[backup])
    assert signal.getsignal(signal.SIGTERM).__name__ == "<lambda>"
    send_sigterm_to_self(sigterm_seen)


def test_the_session_undoes_newest_first_and_never_hides_the_error():
    done = []
    with pytest.raises(ValueError, match="the real error"), Session() as session:
        session.undo("first", done.append, 1)
        session.undo("second", done.append, 2)
        raise ValueError("the real error")
    assert done == [2, 1]

    def broken():
        raise OSError("cannot undo")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError), Session() as session:
            session.undo("the broken step", broken)
            raise KeyError("what stopped training")
    (w,) = [w for w in caught if issubclass(w.category, kerascale.KerascaleWarning)]
    assert "could not undo the broken step" in str(w.message)
    assert "KeyError" in str(w.message) and "cannot undo" in str(w.message)
    # With nothing else going wrong, a failed undo is the error itself.
    with pytest.raises(OSError, match="cannot undo"), Session() as session:
        session.undo("the broken step", broken)


def uncopyable():
    keras.utils.set_random_seed(3)
    widened = Widened()
    widened.units = 3
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(1)(widened(inputs))
    m = keras.Model(inputs, outputs)
    m.compile(optimizer="adam", loss="mse")
    return m


def mapped(n=256):
    x = np.random.default_rng(1).normal(size=(n, 4)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
    return ds.map(lambda a, b: (a * 2.0, b))


def test_trials_borrow_a_model_that_cannot_be_copied(monkeypatch, no_budget):
    """On a bf16 CPU the trials time the model's precision; a model that
    cannot be copied is borrowed (trained, then every variable put back),
    and the precision is still set in place: nothing is dropped."""
    from conftest import CPU_BF16

    from kerascale.sense import hardware

    bf16_host = hardware.Hardware(cpu=CPU_BF16)
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: bf16_host)
    m = uncopyable()
    m.fit(mapped().batch(32), epochs=1, verbose=0)  # optimizer state to keep
    before = [v.numpy().copy() for v in [*m.variables, *m.optimizer.variables]]
    p = kerascale.plan(m, mapped(), batch_size=32, verbose=0)
    after = [v.numpy() for v in [*m.variables, *m.optimizer.variables]]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not p.rebuild and p.reasons["precision"].code == "trials.measured"
    assert not [w for w in p.warnings if w.startswith("Not applied")]
    history = kerascale.fit(m, mapped(), batch_size=32, epochs=1, verbose=0)
    assert history.plan.global_batch_size == 32
    assert int(m.optimizer.iterations) == 16


def test_the_plan_without_a_copy_keeps_the_trials_budget(monkeypatch):
    """Trials on a model that cannot be copied are weighed against the same
    short run: its pipeline trial is skipped, not run without a budget.
    (Without a first estimate of the step, which a model whose call needs
    train_step's inputs does not give, the first candidate is prepared to
    time one: the model is borrowed for it.)"""
    from conftest import CPU_BF16

    from kerascale.measure import first_step
    from kerascale.sense import hardware

    bf16_host = hardware.Hardware(cpu=CPU_BF16)
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: bf16_host)
    monkeypatch.setattr(first_step, "train_seconds_per_sample", lambda *a: None)
    p = kerascale.plan(uncopyable(), mapped(), batch_size=32, epochs=1, verbose=0)
    assert not p.rebuild
    why = p.reasons["data_changes"]
    # Eight steps: refused in steps, with no first speed needed.
    assert "(trials skipped: the pipeline trials would train at least" in why


def test_measurements_borrow_a_model_that_cannot_be_copied():
    """diagnose and an in-process batch search train the model itself when no
    copy can be made, and put every variable back."""
    m = uncopyable()
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x[:, :1]
    m.fit(x, y, epochs=1, verbose=0)  # an optimizer with state to keep
    before = [v.numpy().copy() for v in [*m.variables, *m.optimizer.variables]]
    d = kerascale.diagnose(m, x, y, steps=3, batch_size=32, verbose=0)
    assert d.bound in ("input", "compute", "memory") and d.step_batches_per_s > 0
    r = kerascale.find_batch_size(
        m, x, y, isolate=False, max_batch_size=64, cache=False, verbose=0
    )
    assert 1 <= r.batch_size <= 64
    after = [v.numpy() for v in [*m.variables, *m.optimizer.variables]]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gpu_monitor_stops_sampling_when_its_plain_fit_raises(monkeypatch):
    """Through the NVML seam: the sampling thread and NVML do not outlive a
    plain fit that raised (Keras skipped on_train_end)."""
    import sys

    from test_monitoring import fake_pynvml

    nvml = fake_pynvml()
    shut = []
    nvml.nvmlShutdown = lambda: shut.append(True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = kerascale.callbacks.GPUMonitor(interval=0.05)
    with pytest.raises(RuntimeError):
        model().fit(
            data(seed=1),
            epochs=2,
            verbose=0,
            callbacks=[monitor, Raise("on_train_batch_end", 3, RuntimeError)],
        )
    monitor._thread.join(timeout=5)
    assert not monitor._thread.is_alive() and not monitor.active
    assert shut == [True]
    sampled = nvml.calls["n"]
    time.sleep(0.3)
    assert nvml.calls["n"] == sampled  # nothing samples any more


def test_after_a_plain_fit_that_raised_release_takes_every_change_out_at_once(
    tmp_path, sigterm_seen
):
    """docs/tour.md's hint, followed (issue 55): after a plain `model.fit`
    that raised, the SIGTERM handler is still kerascale's (inert: it passes a
    signal on), and `release()` puts back the one that was there, with no
    signal needed."""
    m = model()
    before = process_state()
    backup = FaultTolerantBackup(tmp_path / "ckpt", save_freq=2, verbose=0)
    with pytest.raises(RuntimeError):
        m.fit(
            data(seed=1),
            epochs=1,
            verbose=0,
            callbacks=[backup, Raise("on_train_batch_end", 2, RuntimeError)],
        )
    assert signal.getsignal(signal.SIGTERM) != before["sigterm"]
    backup.release()
    assert_same_state(before, process_state())
    assert not sigterm_seen
