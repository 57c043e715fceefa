"""End to end on JAX (CPU): `kerascale.fit` against a naive `model.fit`, on the
reference workload of `end_to_end.py` as a JAX user without TensorFlow feeds
it: 32x32x3 uint8 images in NumPy arrays (4096, 10 classes), `Rescaling` in the
model, the small CNN; Keras's `shuffle=True`.

    .venv-jax/bin/python benchmarks/jax_end_to_end.py [--rounds 3] [--epochs 300]

Contestants, timed as samples/s over one epoch after a warm-up epoch, in
alternating order each round (the median over rounds is printed):

- naive: `model.fit(x, y)` (Keras's defaults: batch 32, float32);
- kerascale: the configuration `kerascale.plan` decides for a run of `--epochs`
  epochs from a fresh cache (its decision's seconds are reported), trained by
  `kerascale.fit`;
- expert: the best of a grid (batch {32, 128, 512} x {float32, mixed_bfloat16}),
  timed in round 1.

Results in `results/jax_end_to_end.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np

import kerascale

SAMPLES = 4096


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(SAMPLES, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, size=SAMPLES).astype("int32")
    return x, y


def model(policy="float32"):
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((32, 32, 3), dtype="uint8")
    h = layers.Rescaling(1 / 255.0, dtype=policy)(inputs)
    for filters in (32, 64):
        h = layers.Conv2D(filters, 3, padding="same", activation="relu", dtype=policy)(
            h
        )
        h = layers.MaxPooling2D(dtype=policy)(h)
    h = layers.GlobalAveragePooling2D(dtype=policy)(h)
    outputs = layers.Dense(10, dtype="float32")(h)
    m = keras.Model(inputs, outputs)
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


class EpochTimer(keras.callbacks.Callback):
    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.last = time.perf_counter() - self.start


def timed(fit) -> float:
    """samples/s over the second of two epochs."""
    timer = EpochTimer()
    fit(timer)
    return SAMPLES / timer.last


def naive(x, y) -> float:
    m = model()
    return timed(lambda t: m.fit(x, y, epochs=2, verbose=0, callbacks=[t]))


def point(x, y, batch, policy) -> float:
    m = model(policy)
    return timed(
        lambda t: m.fit(x, y, batch_size=batch, epochs=2, verbose=0, callbacks=[t])
    )


def ours(x, y, plan) -> float:
    m = model()
    return timed(
        lambda t: kerascale.fit(
            m,
            x,
            y,
            batch_size=plan.global_batch_size,
            precision=plan.precision,
            epochs=2,
            verbose=0,
            callbacks=[t],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=300)
    args = parser.parse_args()
    x, y = data()
    grid = {}
    for batch in (32, 128, 512):
        for policy in ("float32", "mixed_bfloat16"):
            grid[(batch, policy)] = point(x, y, batch, policy)
            print(f"grid {batch} {policy}: {grid[(batch, policy)]:.0f}", flush=True)
    expert = max(grid, key=grid.get)
    rows = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["KERASCALE_CACHE_DIR"] = cache
            start = time.perf_counter()
            plan = kerascale.plan(model(), x, y, epochs=args.epochs, verbose=0)
            decided = time.perf_counter() - start
        order = [
            ("naive", naive, ()),
            ("kerascale", ours, (plan,)),
            ("expert", point, expert),
        ]
        if r % 2:
            order.reverse()
        speeds = {name: run(x, y, *extra) for name, run, extra in order}
        rows.append(
            {
                "round": r + 1,
                **speeds,
                "decided_s": round(decided, 1),
                "chose": [plan.global_batch_size, plan.precision],
                "why_batch": plan.reasons["global_batch_size"],
                "why_precision": plan.reasons["precision"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        name: statistics.median(row[name] for row in rows)
        for name in ("naive", "kerascale", "expert")
    }
    summary["expert_config"] = list(expert)
    summary["vs_naive"] = summary["kerascale"] / summary["naive"]
    summary["vs_expert"] = summary["kerascale"] / summary["expert"]
    print(json.dumps(summary))
    out = os.path.join(os.path.dirname(__file__), "results", "jax_end_to_end.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(
            {
                "rows": rows,
                "grid": {f"{b}/{p}": s for (b, p), s in grid.items()},
                "summary": summary,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
