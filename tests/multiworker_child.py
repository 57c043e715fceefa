"""A worker of a real 2-worker cluster on 127.0.0.1, for tests/test_compat.py.

    python multiworker_child.py INDEX PORT0,PORT1 OUT.npz   (one worker)
    python multiworker_child.py single - OUT.npz            (the reference)

Trains the same small model on the same data (global batch 16, no shuffle)
under MultiWorkerMirroredStrategy with kerascale's compat fix, or in one
process, and saves the weights and History.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
index, ports, out = sys.argv[1], sys.argv[2], sys.argv[3]
if index != "single":
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports.split(",")]},
            "task": {"type": "worker", "index": int(index)},
        }
    )

import keras  # noqa: E402 - after TF_CONFIG is set
import numpy as np  # noqa: E402 - after TF_CONFIG is set
import tensorflow as tf  # noqa: E402 - after TF_CONFIG is set

from kerascale import compat  # noqa: E402 - after TF_CONFIG is set

if index == "single":
    strategy = tf.distribute.get_strategy()
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert compat.apply()
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = rng.normal(size=(128, 2)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
history = model.fit(ds, epochs=2, verbose=0)
weights = {f"w{i}": w for i, w in enumerate(model.get_weights())}
np.savez(out, history=np.array(json.dumps(history.history)), **weights)
print("done", flush=True)
