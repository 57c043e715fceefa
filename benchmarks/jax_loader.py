"""The host loader on JAX (`kerascale.callbacks.Prefetch`): is the host's
time hidden behind the step's, or added to it?

    KERAS_BACKEND=jax .venv-jax/bin/python benchmarks/jax_loader.py [--rounds 3]

Two workloads, each timed as samples/s over whole epochs after a warm-up
epoch, in alternating rounds (the median is printed):

- "latency": each batch waits 40 ms on storage (a sleep standing for a network
  disk or a bucket), then is augmented as below; Keras's own answer,
  `PyDataset(workers=4)`, is timed beside it;
- "augment": a `keras.utils.PyDataset` whose `__getitem__` does NumPy work
  per batch (a random crop and flip of uint8 images, then scaling: what an
  image pipeline does on the host), feeding a small CNN;
- "arrays": float32 images in NumPy arrays with Keras's `shuffle=True` (each
  batch is a gather of 128 random rows), feeding the same CNN;
- "tiny": a small MLP on small arrays, where reading a batch takes far less
  than a thread's handoff: the loader must cost nothing there (it goes back to
  the training thread after 8 batches).

For each: plain `model.fit` (the baseline a user runs), the same with
`Prefetch()` in `callbacks`, both again with a callback that has
`on_train_batch_end` (as logging and progress callbacks do; Keras then waits
for each step's logs, where otherwise it dispatches steps ahead and its own
reading overlaps them), and `kerascale.fit` (which installs it); and
the two parts alone: the input (the same host work, no model) and the step
(`model.fit` on batches already made: contiguous slices of a small array).
Overlapped, a run takes about the slower part; in turn, their sum.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np

import kerascale
from kerascale.callbacks import Prefetch

BATCH, SIDE, CROP = 128, 72, 64
LATENCY = 0.04


class Augmented(keras.utils.PyDataset):
    def __init__(self, images, labels, batches):
        super().__init__()
        self.images, self.labels, self.batches = images, labels, batches
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return self.batches

    def __getitem__(self, i):
        take = self.rng.integers(0, len(self.images), BATCH)
        top, left = self.rng.integers(0, SIDE - CROP, 2)
        crop = self.images[take, top : top + CROP, left : left + CROP]
        flip = self.rng.random(BATCH) < 0.5
        crop[flip] = crop[flip, :, ::-1]
        return crop.astype("float32") / 255.0, self.labels[take]


class Remote(keras.utils.PyDataset):
    """Each batch read from storage with `LATENCY` seconds of latency (a
    sleep: the wait on a network disk or a bucket, no CPU), then augmented."""

    def __init__(self, data, **kwargs):
        super().__init__(**kwargs)
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        time.sleep(LATENCY)
        return self.data[i]


class PerStep(keras.callbacks.Callback):
    """A callback with `on_train_batch_end`, as logging and progress
    callbacks have: Keras then waits for each step's logs before the next."""

    def on_train_batch_end(self, batch, logs=None):
        self.last = logs


def mlp():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def cnn():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((CROP, CROP, 3)),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def timed(fit, samples):
    """samples/s of the second of two calls of `fit()` (the first compiles)."""
    fit()
    began = time.perf_counter()
    fit()
    return samples / (time.perf_counter() - began)


def workload(name, batches):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 4096).astype("int32")
    if name in ("augment", "latency"):
        images = rng.integers(0, 255, (4096, SIDE, SIDE, 3), dtype=np.uint8)
        data = Augmented(images, labels, batches)
        if name == "latency":
            data = Remote(data)

        def fit_args():
            return (data,), {}

        def input_alone():
            for i in range(batches):
                data[i]

    else:
        shape = (32,) if name == "tiny" else (CROP, CROP, 3)
        images = rng.random((batches * BATCH, *shape), dtype=np.float32)
        labels = rng.integers(0, 10, batches * BATCH).astype("int32")

        def fit_args():
            return (images, labels), {"batch_size": BATCH, "shuffle": True}

        def input_alone():
            order = np.random.permutation(len(images))
            for i in range(batches):
                images[order[i * BATCH : (i + 1) * BATCH]]

    cached = images[: 4 * BATCH] if name == "tiny" else images[:0]
    if name != "tiny":
        cached = rng.random((4 * BATCH, CROP, CROP, 3), dtype=np.float32)
    return fit_args, input_alone, (cached, labels[: 4 * BATCH])


def run(name, batches, rounds):
    fit_args, input_alone, cached = workload(name, batches)
    build = mlp if name == "tiny" else cnn
    samples = batches * BATCH
    variants = {
        "plain model.fit": lambda m, a, k: m.fit(*a, epochs=1, verbose=0, **k),
        "model.fit + Prefetch()": lambda m, a, k: m.fit(
            *a, epochs=1, verbose=0, callbacks=[Prefetch()], **k
        ),
        "model.fit + a per-step callback": lambda m, a, k: m.fit(
            *a, epochs=1, verbose=0, callbacks=[PerStep()], **k
        ),
        "  the same + Prefetch()": lambda m, a, k: m.fit(
            *a, epochs=1, verbose=0, callbacks=[PerStep(), Prefetch()], **k
        ),
        "kerascale.fit": lambda m, a, k: kerascale.fit(
            m, *a, epochs=1, verbose=0, precision="float32", **k
        ),
    }
    if name == "latency":  # what Keras offers a competent user: workers
        variants["model.fit, PyDataset(workers=4)"] = lambda m, a, k: m.fit(
            Remote(a[0].data, workers=4), epochs=1, verbose=0, **k
        )
    rates = {v: [] for v in variants}
    parts = {"input alone": [], "step alone": []}
    for _ in range(rounds):
        for label, call in variants.items():
            model = build()
            args, kwargs = fit_args()
            rates[label].append(
                timed(lambda c=call, m=model, a=args, k=kwargs: c(m, a, k), samples)
            )
        began = time.perf_counter()
        input_alone()
        parts["input alone"].append(samples / (time.perf_counter() - began))
        model, (x, y) = build(), cached
        steps = batches // 4
        parts["step alone"].append(
            timed(
                lambda m=model, x=x, y=y, n=steps: m.fit(
                    x, y, batch_size=BATCH, epochs=n, verbose=0, shuffle=False
                ),
                steps * 4 * BATCH,
            )
        )
    out = {k: statistics.median(v) for k, v in {**parts, **rates}.items()}
    host, step = out["input alone"], out["step alone"]
    out["in turn (1/(1/input + 1/step))"] = 1 / (1 / host + 1 / step)
    out["overlapped (min(input, step))"] = min(host, step)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=24)
    args = p.parse_args()
    results = {}
    for name in ("latency", "augment", "arrays", "tiny"):
        batches = args.batches * 20 if name == "tiny" else args.batches
        results[name] = run(name, batches, args.rounds)
        print(f"\n{name} (samples/s, median of {args.rounds} alternating rounds)")
        for label, value in results[name].items():
            print(f"  {label:34s} {value:9.0f}")
        plain = results[name]["plain model.fit"]
        for label in ("model.fit + Prefetch()", "kerascale.fit"):
            print(f"  {label} / plain: {results[name][label] / plain:.2f}x")
        synced = results[name]["model.fit + a per-step callback"]
        loaded = results[name]["  the same + Prefetch()"]
        print(f"  with a per-step callback, Prefetch: {loaded / synced:.2f}x")
    os.makedirs("benchmarks/results", exist_ok=True)
    with open("benchmarks/results/jax_loader.json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
