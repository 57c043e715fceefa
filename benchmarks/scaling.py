"""The scaling estimate (`kerascale.plan.scaling`) against data-parallel runs
measured here: 1, 2 and 4 CPU devices of one process (JAX,
`XLA_FLAGS=--xla_force_host_platform_device_count=N`), the same per-replica
batch on each (weak scaling, as N workers would run it).

    KERAS_BACKEND=jax .venv-jax/bin/python benchmarks/scaling.py [--batch 64]

Each N runs in a fresh process: an MLP (784 -> 1024 -> 1024 -> 10, Adam,
1.9M parameters: 7.6 MB of float32 gradients) under `DataParallel` over the
N devices, timed over 30 steps after 5 of warm-up (the median step). The
prediction takes the one-device step and the gradient bytes, with the
"cpu" link and shared compute (the devices share this machine's cores).
Prints the measured and predicted step per N and the error, with the
documented "cpu" link and with the link fitted to the 2-device run (then
tested on the 4-device one); writes benchmarks/results/scaling.json.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

import _results  # benchmarks/_results.py

ROOT = pathlib.Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, statistics, sys, time
os.environ["KERAS_BACKEND"] = "jax"
import jax, keras, numpy as np
n, batch = len(jax.devices()), int(sys.argv[1])
if n > 1:
    keras.distribution.set_distribution(keras.distribution.DataParallel())
keras.utils.set_random_seed(0)
inputs = keras.Input((784,))
h = keras.layers.Dense(1024, activation="relu")(inputs)
h = keras.layers.Dense(1024, activation="relu")(h)
model = keras.Model(inputs, keras.layers.Dense(10)(h))
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).normal(size=(batch * n, 784)).astype("float32")
y = np.zeros(batch * n, "int32")
times = []
for i in range(35):
    start = time.perf_counter()
    model.train_on_batch(x, y)
    if i >= 5:
        times.append(time.perf_counter() - start)
grads = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
print(json.dumps({"devices": n, "step": statistics.median(times), "grad_bytes": grads}))
"""


def run(devices, batch):
    flags = f"--xla_force_host_platform_device_count={devices}" if devices > 1 else ""
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_FLAGS": flags}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(batch)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    os.environ.setdefault("KERAS_BACKEND", "jax")  # the parent imports kerascale
    sys.path.insert(0, str(ROOT))
    from kerascale.plan import scaling

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64, help="per replica")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    measured = {n: [] for n in (1, 2, 4)}
    grads = 0
    for _ in range(args.rounds):  # alternate, against a busy machine's drift
        for n in measured:
            r = run(n, args.batch)
            measured[n].append(r["step"])
            grads = r["grad_bytes"]
    median = {n: sorted(v)[len(v) // 2] for n, v in measured.items()}
    # The link fitted to the 2-device run (all it adds beyond twice the
    # one-device step, taken as the all-reduce), then tested on 4 devices.
    latency = scaling.INTERCONNECTS["cpu"][1]
    extra = median[2] - 2 * median[1] - 2 * latency
    fitted = grads / extra if extra > 0 else None
    rows = []
    for n, step in median.items():
        common = dict(kind="cpu", shared_compute=True)
        predicted = scaling.estimate(median[1], args.batch, grads, n, **common)
        refit = scaling.estimate(
            median[1], args.batch, grads, n, bandwidth=fitted, **common
        )
        row = {
            "devices": n,
            "measured_step_s": round(step, 5),
            "predicted_step_s": round(predicted.step_seconds, 5),
            "predicted_allreduce_s": round(predicted.allreduce_seconds, 5),
            "error": round(predicted.step_seconds / step - 1, 3),
            "fitted_link_bytes_per_s": round(fitted or 0),
            "fitted_predicted_step_s": round(refit.step_seconds, 5),
            "fitted_error": round(refit.step_seconds / step - 1, 3),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    _results.write(
        "scaling", batch_per_replica=args.batch, gradient_bytes=grads, rows=rows
    )


if __name__ == "__main__":
    main()
