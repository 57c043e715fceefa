"""Run by test_strategy.py in a child process: TensorFlow's logical devices must
be configured before the runtime starts, which a pytest process has done.

Two logical CPUs stand in for two GPUs. Each mode named on the command line
(a comparison, "search" or "backup") prints its results as one JSON line.
"""

import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import kerascale

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)


def model_and_twin():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(16, activation="tanh")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(h)
    model = keras.Model(inputs, outputs)
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    for m in (model, twin):
        m.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    return model, twin


def search():
    """kerascale.find_batch_size under MirroredStrategy."""
    model, _ = model_and_twin()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 6)).astype("float32")
    y = rng.integers(0, 3, size=512)
    r = kerascale.find_batch_size(
        model,
        x,
        y,
        strategy="mirrored",
        precision="float32",
        memory_limit="8GiB",
        max_batch_size=128,
        verbose=0,
        cache=False,
    )
    return {
        "replicas": r.replicas,
        "batch_size": r.batch_size,
        "per_replica_batch_size": r.per_replica_batch_size,
        "precision": r.precision,
        "strategy": r.strategy,
        "outcomes": sorted({p.outcome for p in r.probes}),
        "largest_probe": max(p.batch for p in r.probes),
    }


rng = np.random.default_rng(0)
x = rng.normal(size=(96, 6)).astype("float32")
y = rng.integers(0, 3, size=96)


def backup():
    # FaultTolerantBackup under MirroredStrategy: stopped mid-epoch, resumed by a
    # new model object, against an uninterrupted run with the same checkpoints.
    import tempfile

    from kerascale.callbacks import checkpoint_store as store

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                self.model.stop_training = True

    def run(directory, stop=False):
        # A new dataset per run, as in a new process: its shuffle seeds advance
        # with every iterator created on it.
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=3).batch(16)
        model, _ = model_and_twin()
        history = kerascale.fit(
            model,
            ds,
            strategy="mirrored",
            precision="float32",
            optimize_data=False,
            epochs=3,
            checkpoint_dir=directory,
            checkpoint_freq=2,
            callbacks=[StopAt()] if stop else [],
            verbose=0,
        )
        return model, history

    with tempfile.TemporaryDirectory() as tmp:
        # The first run in a process differs slightly from later ones (as it
        # does without a backup); compare runs that are not the first.
        run(tmp + "/warm-up")
        reference, _ = run(tmp + "/ref")
        run(tmp + "/run", stop=True)
        stopped = store.verify(store.scan(tmp + "/run")[0])
        resumed, history = run(tmp + "/run")
    diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(reference.get_weights(), resumed.get_weights(), strict=True)
    )
    return {
        "replicas": history.plan.replicas,
        "stopped_at": [
            stopped["epoch"],
            stopped["step"],
            stopped["data"]["mode"],
        ],
        "epochs": len(history.history["loss"]),
        "iterations": int(resumed.optimizer.iterations.numpy()),
        "max_weight_diff": diff,
    }


def compare(mode):
    """One model trained under MirroredStrategy over both devices, its twin on
    one device, and their results."""
    model, twin = model_and_twin()
    if mode == "dataset":
        data = {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(8)}
    else:
        data = {"x": x, "y": y}
    common = dict(
        batch_size=16, precision="float32", epochs=1, shuffle=False, verbose=0
    )
    extra = {}
    if mode == "accumulate16":
        # The same under mixed_float16: loss scaling around accumulation.
        common["precision"] = "mixed_float16"
    if mode.startswith("accumulate"):
        # 32 per update = 8 per replica x 2 replicas x 2 micro-batches, against
        # one device taking 32 at once.
        common["batch_size"] = 32
        extra = {"accumulation_steps": 2}
    mirrored = kerascale.fit(model, strategy="mirrored", **data, **common, **extra)
    single = kerascale.fit(twin, strategy="default", **data, **common)
    diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(model.get_weights(), twin.get_weights(), strict=True)
    )
    initial = model_and_twin()[0].get_weights()
    return {
        "replicas": mirrored.plan.replicas,
        "split": [
            mirrored.plan.micro_batch_size,
            mirrored.plan.accumulation_steps,
            mirrored.plan.global_batch_size,
        ],
        "devices": list(mirrored.plan.devices),
        "strategy": mirrored.plan.strategy,
        "single_replicas": single.plan.replicas,
        "max_weight_diff": diff,
        "loss": [mirrored.history["loss"][0], single.history["loss"][0]],
        "accuracy": [mirrored.history["accuracy"][0], single.history["accuracy"][0]],
        "changed": any(
            not np.allclose(a, b)
            for a, b in zip(model.get_weights(), initial, strict=True)
        ),
    }


# Each mode named on the command line, one after another in this process (one
# TensorFlow start-up for all: they are independent, and each fit leaves the
# process as it found it); one JSON line each, an error as its traceback.
for mode in sys.argv[1:]:
    try:
        if mode == "search":
            result = search()
        elif mode == "backup":
            result = backup()
        else:
            result = compare(mode)
    except Exception:
        result = {"error": traceback.format_exc()}
    print(json.dumps({"mode": mode, **result}), flush=True)
