"""A worker of a real 2-worker cluster on 127.0.0.1, for tests/test_compat.py
and tests/test_multiworker.py.

    python multiworker_child.py MODE INDEX PORT0,PORT1 OUTDIR [WORKER_TIMEOUT]

INDEX is 0 or 1 (a worker), or "single" (the one-process reference).
MODE:
- compat: plain `model.fit` under MultiWorkerMirroredStrategy with
  kerascale's compat fix only (global batch 16, no shuffle).
- fit: a script with nothing but `import kerascale` at its top (the import
  joins the cluster), then `kerascale.fit` of an unbatched dataset with
  batch_size=16 and validation data; each worker seeds its model
  differently (so the chief's weights must be broadcast). Then `evaluate`
  and `predict` of a model built under the strategy's scope. Saves weights,
  History, metrics, predictions.
- arrays: explicit control (KERASCALE_AUTO_CONNECT=0 and connect_cluster()
  first), then `kerascale.fit` of NumPy arrays with Keras's own shuffle, each
  worker with a different TF seed (so the chief's seed must be shared).
- long: `kerascale.fit` for many epochs with a checkpoint every 4 batches,
  printing "epoch N" lines; the test kills one worker (or sends it SIGTERM),
  then restarts both. A preempted worker prints "exit CODE at STEP".
- timesave, budget: a time-based save_freq ("1s") or a TimeBudget, with
  worker 1's clock running 3 times as fast as worker 0's (a clock seam);
  records the steps it saved at, or stopped at.
- steptime-off, steptime-idle, steptime-saving (benchmarks/multiworker.py):
  step times of 300 steps with no agreement between workers, with one that
  no flag raises, and with a time-based save every second (each proposal's
  round trip is recorded).
"""

import faulthandler
import json
import os
import signal
import sys
import time

faulthandler.enable()  # a crash in TensorFlow's C++ prints the Python stack
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test asks where it hangs

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
mode, index, ports, out = sys.argv[1:5]
worker_timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 60
# "long" only: worker 1 kills itself (SIGKILL) at this epoch's end, before the
# checkpoint's exchange at that end (kerascale's callbacks run after the user's).
die_at = int(sys.argv[6]) if len(sys.argv) > 6 else None
LONG_EPOCHS = 6  # "long": test_multiworker.py resumes it to this end
if index != "single":
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports.split(",")]},
            "task": {"type": "worker", "index": int(index)},
        }
    )

# The join at import takes its worker_timeout from the environment.
os.environ["KERASCALE_WORKER_TIMEOUT"] = str(worker_timeout)
if mode in ("compat", "arrays"):
    os.environ["KERASCALE_AUTO_CONNECT"] = "0"

import keras  # noqa: E402 - after TF_CONFIG is set
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerascale  # noqa: E402
from kerascale import _keras_compat as compat  # noqa: E402

if mode == "compat":
    strategy = (
        tf.distribute.get_strategy()
        if index == "single"
        else tf.distribute.MultiWorkerMirroredStrategy()
    )
    if index != "single":
        assert compat.apply()
elif mode == "arrays":
    strategy = kerascale.connect_cluster(worker_timeout=worker_timeout)
    assert (strategy is None) == (index == "single")
else:  # joined by `import kerascale`, on a cluster only
    joined = kerascale.apply.tensorflow.cluster.connection()
    assert (joined is None) == (index == "single")
    strategy = joined and joined.strategy

seed = 0 if index == "single" else int(index)
keras.utils.set_random_seed(seed)


def build():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = rng.normal(size=(128, 2)).astype("float32")
results = {}

if mode == "compat":
    with strategy.scope():
        model = build()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = model.fit(ds, epochs=2, verbose=0)
elif mode == "fit":
    model = build()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    val = tf.data.Dataset.from_tensor_slices((x[:40], y[:40]))
    history = kerascale.fit(
        model,
        ds,
        batch_size=16,
        epochs=2,
        precision="float32",
        optimize_data=True,
        validation_data=val,
        verbose=0,
    )
    results["plan"] = history.plan.to_dict()
    # evaluate and predict, distributed over the workers where there are two.
    with (strategy or tf.distribute.get_strategy()).scope():
        twin = build()
    twin.set_weights(model.get_weights())
    batched = tf.data.Dataset.from_tensor_slices((x[:100], y[:100])).batch(16)
    results["evaluate"] = twin.evaluate(batched, verbose=0, return_dict=True)
    results["predict"] = twin.predict(
        tf.data.Dataset.from_tensor_slices(x[:100]).batch(16), verbose=0
    ).tolist()
elif mode == "arrays":
    if index != "single":
        tf.random.set_seed(100 + int(index))
    else:
        tf.random.set_seed(100)
    model = build()
    history = kerascale.fit(
        model, x, y, batch_size=16, epochs=2, precision="float32", verbose=0
    )
elif mode == "long":
    model = build()
    ds = tf.data.Dataset.from_tensor_slices((x, y))

    class Say(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(f"epoch {epoch} {time.time():.3f}", flush=True)
            if epoch == die_at and index == "1":
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.02)  # long enough for the test to kill mid-epoch

    try:
        history = kerascale.fit(
            model,
            ds,
            batch_size=16,
            epochs=LONG_EPOCHS,
            precision="float32",
            optimize_data=True,
            checkpoint_dir=os.path.join(
                out, "ckpt-single" if index == "single" else "ckpt"
            ),
            checkpoint_freq=4,
            callbacks=[Say()],
            verbose=0,
            worker_timeout=worker_timeout,
        )
    except SystemExit as e:
        print(f"exit {e.code} at {int(model.optimizer.iterations)}", flush=True)
        raise
elif mode in ("timesave", "budget"):
    model = build()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    rate = 3.0 if index == "1" else 1.0
    began = time.monotonic()

    def clock():
        return began + (time.monotonic() - began) * rate

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.01)

    saves = []
    if mode == "timesave":
        callback = kerascale.callbacks.FaultTolerantBackup(
            os.path.join(out, f"ckpt-{index}"), save_freq="1s", verbose=0
        )
        callback._clock = clock
        real_save = callback._save

        def recording_save(**kwargs):
            saves.append(callback._s.global_step)
            return real_save(**kwargs)

        callback._save = recording_save
        epochs = 15
    else:
        callback = kerascale.callbacks.TimeBudget(6.0, reserve=0.5, clock=clock)
        epochs = 10_000
    history = kerascale.fit(
        model,
        ds,
        batch_size=16,
        epochs=epochs,
        precision="float32",
        optimize_data=True,
        callbacks=[Slow(), callback],
        verbose=0,
    )
    results["saves"] = saves
    results["iterations"] = int(model.optimizer.iterations)
elif mode.startswith("steptime"):
    from kerascale.apply import step_agreement as agreement_lib

    variant = mode.split("-")[1]
    if variant == "off":
        agreement_lib.for_run = lambda model, run: None
    rounds = []
    real_propose = agreement_lib.Agreement._propose

    def timed_propose(self):
        began = time.perf_counter()
        real_propose(self)
        rounds.append(time.perf_counter() - began)

    agreement_lib.Agreement._propose = timed_propose
    model = build()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat(40)
    stamps = []

    class Stamp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    history = kerascale.fit(
        model,
        ds,
        batch_size=16,
        epochs=1,
        steps_per_epoch=300,
        precision="float32",
        callbacks=[
            Stamp(),
            kerascale.callbacks.FaultTolerantBackup(
                os.path.join(out, f"ckpt-{mode}-{index}"),
                save_freq="1s" if variant == "saving" else "1000h",
                verbose=0,
            ),
        ],
        verbose=0,
    )
    steps = np.diff(stamps[50:])  # after warm-up
    results["step_ms"] = float(np.median(steps) * 1000)
    results["round_ms"] = [r * 1000 for r in rounds]
else:
    raise SystemExit(f"unknown mode {mode}")

name = f"w{index}" if index != "single" else "single"
weights = {f"w{i}": w for i, w in enumerate(model.get_weights())}
results["history"] = history.history
np.savez(
    os.path.join(out, f"{mode}-{name}.npz"),
    results=np.array(json.dumps(results)),
    **weights,
)
print("done", flush=True)
