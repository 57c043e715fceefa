"""Acceptance on a real GPU: what the seams in tests/test_gpu_memory.py
stand in for. Needs a GPU TensorFlow can use and nvidia-ml-py
(`pip install -e ".[test,gpu]"`); run `pytest -m gpu tests/gpu` and report
the output (README: "On a GPU").

Slow by nature (ResNet50 traced a dozen times; each probe that runs out of
memory costs 10 s, TensorFlow's allocator's wait): 10 to 30 minutes.
"""

import gc
import itertools
import statistics
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerascale
from kerascale.callbacks import GPUMonitor

# Listing physical devices does not initialise them: elsewhere every test
# here is skipped without touching a device.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not tf.config.list_physical_devices("GPU"),
        reason="no GPU visible to TensorFlow (tests/gpu is for GPU machines)",
    ),
]

SHAPE = (224, 224, 3)
CLASSES = 1000


def resnet50():
    model = keras.applications.ResNet50(weights=None, input_shape=SHAPE)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
    )
    return model


def images(n=100_000):
    """n synthetic ImageNet-shaped samples, unbatched, from one element (no
    host memory for n)."""
    x = tf.random.uniform(SHAPE)
    y = tf.constant(7, tf.int64)
    return tf.data.Dataset.from_tensors((x, y)).repeat(n)


def fits(batch: int, policy: str) -> bool:
    """Plain Keras in this process: does a batch train (two steps) and
    validate under `policy`? Memory running out is ResourceExhaustedError."""
    keras.config.set_dtype_policy(policy)
    try:
        model = resnet50()
        ds = images().batch(batch).take(1).cache().repeat()
        model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
        model.evaluate(ds, steps=1, verbose=0)
        return True
    except tf.errors.ResourceExhaustedError:
        return False
    finally:
        keras.config.set_dtype_policy("float32")
        model = ds = None
        gc.collect()


def largest_batch(policy: str, granularity: int = 8) -> int:
    """The truth: doubling from 16, then bisection to `granularity`."""
    lo, hi = 0, 16
    while fits(hi, policy):
        lo, hi = hi, 2 * hi
    while hi - lo > granularity:
        mid = (lo + hi) // 2 // granularity * granularity
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid, policy) else (lo, mid)
    return lo


def test_nvml_detection_and_the_plans_precision():
    hw = kerascale.detect_hardware()
    assert hw.gpus, hw.notes
    gpu = hw.gpus[0]
    assert gpu.memory_total, f"NVML did not report memory: {hw.notes}"
    assert gpu.compute_capability, hw.notes
    plan = kerascale.plan(resnet50(), images(1024), batch_size=32, verbose=0)
    expected = (
        "mixed_bfloat16"
        if gpu.compute_capability >= (8, 0)
        else "mixed_float16"
        if gpu.compute_capability >= (7, 0)
        else "float32"
    )
    assert plan.precision == expected, plan.describe()


def test_the_found_batch_is_within_10_percent_below_the_truth_and_trains():
    model = resnet50()
    result = kerascale.find_batch_size(model, images(), cache=False, verbose=1)
    print(result)
    truth = largest_batch(result.precision)
    print(f"found {result.per_replica_batch_size} per replica, truth {truth}")
    # The true largest lies in [truth, truth + 8): the bisection's granule.
    assert 0.9 * truth <= result.per_replica_batch_size < truth + 8
    assert "this process's TensorFlow allocator" in result.reasons["memory"]
    history = kerascale.fit(
        model,
        images(),
        batch_size=result.batch_size,
        steps_per_epoch=3,
        epochs=1,
        verbose=0,
    )
    assert history.plan.global_batch_size == result.batch_size
    assert int(model.optimizer.iterations) == 3


class StepTimes(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())

    def median_step(self, skip=5):
        t = self.times[skip:]
        return statistics.median(b - a for a, b in itertools.pairwise(t))


def test_mixed_precision_steps_are_at_least_1_5x_faster_than_float32():
    hw = kerascale.detect_hardware()
    if (hw.gpus[0].compute_capability or (0, 0)) < (7, 0):
        pytest.skip("no tensor cores below compute capability 7.0")
    mixed = kerascale.plan(resnet50(), images(1024), batch_size=64, verbose=0)
    medians = {"float32": [], mixed.precision: []}
    for _ in range(2):  # alternated: A B A B
        for precision in medians:
            timer = StepTimes()
            kerascale.fit(
                resnet50(),
                images(),
                batch_size=64,
                precision=precision,
                steps_per_epoch=30,
                epochs=1,
                callbacks=[timer],
                verbose=0,
            )
            medians[precision].append(timer.median_step())
    f32, mp = min(medians["float32"]), min(medians[mixed.precision])
    print(f"step: float32 {f32 * 1e3:.1f} ms, {mixed.precision} {mp * 1e3:.1f} ms")
    assert f32 / mp >= 1.5


def test_gpu_monitor_writes_its_scalars(tmp_path):
    inputs = keras.Input((512,))
    h = keras.layers.Dense(2048, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile("adam", "mse")
    x = np.random.rand(65536, 512).astype("float32")
    y = np.random.rand(65536, 1).astype("float32")
    history = kerascale.fit(
        model,
        x,
        y,
        batch_size=256,
        epochs=2,
        callbacks=[GPUMonitor(log_dir=str(tmp_path), interval=0.05)],
        verbose=0,
    )
    assert len(history.history["gpu0_utilization"]) == 2
    assert min(history.history["gpu0_memory_used"]) > 0
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events, "GPUMonitor wrote no TensorBoard event file"
    tags = {
        v.tag
        for path in events
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for v in event.summary.value
    }
    assert "gpu/gpu0_utilization" in tags and "gpu/gpu0_memory_used" in tags


def test_after_fit_this_process_can_still_allocate():
    """The search probes in this process: afterwards its allocator holds no
    more than before (and the trained model), and a large tensor fits."""
    model = resnet50()
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    kerascale.fit(model, images(4096), steps_per_epoch=2, epochs=1, verbose=0)
    gc.collect()
    after = tf.config.experimental.get_memory_info("GPU:0")["current"]
    weights = sum(v.numpy().nbytes for v in model.weights)
    optimizer = sum(v.numpy().nbytes for v in model.optimizer.variables)
    assert after - before <= 2 * (weights + optimizer) + (64 << 20)
    big = tf.random.uniform((1 << 28,))  # 1 GiB
    assert float(tf.reduce_sum(big[:10])) >= 0
