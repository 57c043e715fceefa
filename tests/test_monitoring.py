"""Throughput, GPUMonitor, TimeBudget and ProfileWindow: real training runs,
files read back, a fake NVML at the hardware seam, and a fake clock."""

import copy
import glob
import logging
import sys
import time
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerascale
from kerascale.callbacks import GPUMonitor, ProfileWindow, Throughput, TimeBudget
from kerascale.errors import ConfigurationError


def small_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(8), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


def small_data(n=64, batch=8):
    x = np.random.default_rng(3).normal(size=(n, 3)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(batch)


def scalars(log_dir):
    """{tag: [(step, value)]} from every event file under log_dir."""
    out = {}
    for path in glob.glob(f"{log_dir}/**/events.out.tfevents.*", recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tensor = tf.make_ndarray(value.tensor)
                if tensor.dtype.kind not in "fiu" or tensor.size != 1:
                    continue  # Keras's TensorBoard also writes graph traces
                out.setdefault(value.tag, []).append((event.step, float(tensor)))
    return out


def test_throughput_keeps_its_figures_out_of_history_and_writes_tensorboard(
    tmp_path,
):
    """Its figures (scales of 1e-2 to 1e4) stay out of History and Keras's
    progress line: in TensorBoard, `epochs_seen` and `summary()`."""
    throughput = Throughput(8, log_dir=tmp_path)
    history = small_model().fit(
        small_data(), epochs=3, verbose=0, callbacks=[throughput]
    )
    assert set(history.history) == {"loss"}
    read = scalars(tmp_path)
    assert [s for s, _ in read["throughput/samples_per_second"]] == [0, 1, 2]
    seen = throughput.epochs_seen
    assert read["throughput/samples_per_second"][2][1] == pytest.approx(
        seen[2]["samples_per_second"], rel=1e-6
    )
    table = throughput.summary().splitlines()
    assert table[0].split()[:2] == ["epoch", "samples/s"] and len(table) == 4
    assert f"{seen[0]['samples_per_second']:,.0f}" in table[1]
    # Numbered as Keras prints them ("Epoch 1/3"), not from 0 (issue 55),
    # and a run that starts later (a resume) from where it starts.
    assert [row.split()[0] for row in table[1:]] == ["1", "2", "3"]
    small_model().fit(
        small_data(), epochs=5, initial_epoch=3, verbose=0, callbacks=[throughput]
    )
    assert throughput.epoch_numbers == [4, 5]
    assert throughput.summary().splitlines()[1].split()[0] == "4"


def test_throughput_in_logs_keeps_the_old_behaviour(tmp_path):
    history = small_model().fit(
        small_data(),
        epochs=3,
        verbose=0,
        callbacks=[Throughput(8, log_dir=tmp_path, in_logs=True)],
    )
    h = history.history
    for key in ("samples_per_second", "steps_per_second", "step_time_median"):
        assert len(h[key]) == 3 and all(x > 0 for x in h[key])
    assert all(
        p90 >= med
        for p90, med in zip(h["step_time_p90"], h["step_time_median"], strict=True)
    )
    assert h["samples_per_second"][-1] == pytest.approx(8 * h["steps_per_second"][-1])
    assert h["eta_seconds"][-1] == 0 and h["eta_seconds"][0] > 0
    read = scalars(tmp_path)
    assert [s for s, _ in read["throughput/samples_per_second"]] == [0, 1, 2]
    assert read["throughput/samples_per_second"][2][1] == pytest.approx(
        h["samples_per_second"][2], rel=1e-6
    )


def test_profile_window_writes_a_trace(tmp_path):
    window = ProfileWindow(tmp_path, start_step=3, stop_step=5)
    small_model().fit(small_data(), epochs=2, verbose=0, callbacks=[window])
    assert window.traced == (3, 5)
    traces = glob.glob(f"{tmp_path}/train/plugins/profile/*/*.xplane.pb")
    assert traces and all(tf.io.gfile.stat(t).length > 0 for t in traces)


def test_profile_window_past_the_end_of_training_traces_nothing(tmp_path):
    window = ProfileWindow(tmp_path, start_step=100, stop_step=101)
    small_model().fit(small_data(), epochs=1, verbose=0, callbacks=[window])
    assert window.traced is None
    assert not glob.glob(f"{tmp_path}/train/plugins/profile/*/*.xplane.pb")


def fake_pynvml(gpus=2, fail_init=False):
    m = types.ModuleType("pynvml")

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: gpus
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    calls = {"n": 0}

    def utilization(h):
        calls["n"] += 1
        return types.SimpleNamespace(gpu=50 + 10 * h)

    m.nvmlDeviceGetUtilizationRates = utilization
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30)
    m.nvmlDeviceGetPowerUsage = lambda h: 150_000 + h * 1000
    m.calls = calls
    return m


def test_gpu_monitor_samples_nvml_through_the_seam(tmp_path, monkeypatch):
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = GPUMonitor(log_dir=tmp_path, interval=0.01)

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.01)

    history = small_model().fit(
        small_data(), epochs=2, verbose=0, callbacks=[monitor, Slow()]
    )
    assert nvml.calls["n"] >= 4  # sampled in the background, both GPUs
    assert history.history["gpu0_utilization"] == [50.0, 50.0]
    assert history.history["gpu1_utilization"] == [60.0, 60.0]
    assert history.history["gpu1_memory_used"] == [2.0 * 2**30] * 2
    assert history.history["gpu0_power_watts"] == [150.0, 150.0]
    assert not monitor.active and not monitor._thread.is_alive()
    assert scalars(tmp_path)["gpu/gpu1_utilization"] == [(0, 60.0), (1, 60.0)]


@pytest.mark.parametrize("nvml", [None, "broken"])
def test_gpu_monitor_without_nvml_says_so_once_and_does_nothing(
    tmp_path, monkeypatch, caplog, nvml
):
    from kerascale.callbacks import gpu_monitor

    module = None if nvml is None else fake_pynvml(fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(gpu_monitor, "_SAID", set())
    monitor = GPUMonitor(log_dir=tmp_path)
    with (
        caplog.at_level(logging.INFO, logger="kerascale"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        history = small_model().fit(
            small_data(), epochs=2, verbose=0, callbacks=[monitor]
        )
        # A copy (a tuner's next trial) says nothing more.
        small_model().fit(
            small_data(), epochs=1, verbose=0, callbacks=[copy.deepcopy(monitor)]
        )
    said = [r for r in caplog.records if "GPUMonitor" in r.getMessage()]
    assert len(said) == 2 and "not monitoring" in said[0].getMessage()
    # Shown, as a warning, once (issue 55: at INFO only, nothing was shown).
    shown = [w for w in caught if issubclass(w.category, kerascale.KerascaleWarning)]
    assert len(shown) == 1 and "nvidia-ml-py" in str(shown[0].message)
    assert not monitor.active and "NVML" in monitor.reason
    assert not any(k.startswith("gpu") for k in history.history)
    assert scalars(tmp_path) == {}


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_time_budget_stops_before_the_deadline_with_a_fake_clock():
    clock = FakeClock()
    budget = TimeBudget(100, reserve=5, clock=clock)

    class Tick(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            clock.now += 3.0  # every step takes 3 "seconds"

    with pytest.warns(kerascale.KerascaleWarning) as said:
        history = small_model().fit(
            small_data(), epochs=50, verbose=0, callbacks=[Tick(), budget]
        )
    assert budget.stopped_early
    # Stopped at the last step that leaves the reserve: 3 s steps, 5 s reserve.
    assert 100 - 5 - 3 <= clock.now <= 100 - 5
    assert len(history.history["loss"]) == 4  # 8 steps of 3 s per epoch
    messages = [str(w.message) for w in said]
    assert any("over the budget" in m for m in messages)  # projected, then
    assert any("stopping after" in m for m in messages)  # stopped
    # Both from the user's line that called model.fit, not Keras's internals.
    ours = [w for w in said if w.category is kerascale.KerascaleWarning]
    assert {w.filename for w in ours} == {__file__}


@pytest.mark.serial
def test_time_budget_real_short_budget_stops_in_time():
    budget = TimeBudget(4.0, reserve=0.5)

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.05)

        def on_train_end(self, logs=None):
            self.ended = time.monotonic()

    slow = Slow()
    small_model().fit(small_data(), epochs=10_000, verbose=0, callbacks=[budget, slow])
    assert budget.stopped_early
    assert slow.ended - budget._start < 4.0


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: TimeBudget("18 hours"), "budget"),
        (lambda: TimeBudget(-1), "budget"),
        (lambda: TimeBudget(0), "budget"),
        (lambda: TimeBudget(True), "budget"),
        (lambda: TimeBudget(10, reserve=20), "reserve"),
        (lambda: ProfileWindow("logs", start_step=5, stop_step=2), "stop_step"),
        (lambda: ProfileWindow("logs", start_step=0, stop_step=2), "start_step"),
        (lambda: ProfileWindow("", 1, 2), "log_dir"),
        (lambda: Throughput(batch_size=0), "batch_size"),
        (lambda: GPUMonitor(interval=-1), "interval"),
    ],
)
def test_bad_arguments_name_themselves(make, name):
    with pytest.raises(ConfigurationError, match=rf"{name}.*Received"):
        make()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"time_budget": "18 hours"}, "time_budget"),
        ({"time_budget": -1}, "time_budget"),
        ({"profile": (5, 2)}, "profile"),
        ({"profile": "yes"}, "profile"),
        ({"log_dir": ""}, "log_dir"),
    ],
)
def test_fit_validates_monitoring_arguments(kwargs, name):
    with pytest.raises(ConfigurationError, match=rf"{name}.*Received"):
        kerascale.fit(small_model(), small_data(), verbose=0, **kwargs)


def test_accepted_durations():
    assert TimeBudget("18h").budget == 18 * 3600
    assert TimeBudget("90min").budget == 5400
    assert TimeBudget("1h30min").budget == 5400
    assert TimeBudget(2.5).budget == 2.5


@pytest.mark.serial
def test_fit_installs_monitoring_and_resumes_after_its_time_budget(tmp_path):
    log_dir, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    data = small_data(n=256)
    history = kerascale.fit(
        small_model(),
        data,
        epochs=10_000,
        log_dir=log_dir,
        profile=(2, 3),
        time_budget=6,
        checkpoint_dir=ckpt,
        checkpoint_freq=50,
        batch_size=8,
        verbose=0,
    )
    assert len(history.history["loss"]) < 10_000
    assert "samples_per_second" not in history.history  # TensorBoard has them
    assert "throughput/samples_per_second" in scalars(log_dir)
    assert glob.glob(f"{log_dir}/train/plugins/profile/*/*.xplane.pb")
    # The final checkpoint was written on the way out: a rerun continues there.
    model = small_model()
    again = kerascale.fit(
        model,
        data,
        epochs=len(history.history["loss"]) + 1,
        checkpoint_dir=ckpt,
        batch_size=8,
        verbose=0,
    )
    assert len(again.history["loss"]) == len(history.history["loss"]) + 1
