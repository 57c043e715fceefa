"""End-to-end speed: naive Keras, kerascale's defaults, and an expert's grid.

    python benchmarks/end_to_end.py [--workloads cnn,bn] [--out benchmarks/results]

Two CPU workloads, each on synthetic 32x32x3 uint8 images with 10 classes and an
augmenting `tf.data` map (random flip, pad-and-crop, brightness):

- cnn: the reference workload, a small CNN on 4096 images;
- bn: compute-bound and BatchNorm-heavy (six 64-channel conv + BatchNorm
  blocks) on 2048 images, where a parallel map competes with the model for the
  same cores and bf16 gains little.

Contestants, each timed over one epoch after a warm-up epoch (tracing, the
first pass of the pipeline), in samples/s. The grid runs rounds - 1 times
(median per point) to find the expert's configuration; then naive, kerascale
and that configuration run side by side for `--rounds` rounds in rotating
order, and the medians are reported:

- naive: `model.fit(ds.map(aug).batch(32))`, float32, no prefetch;
- kerascale: `kerascale.fit(model, ds.map(aug))` with every default (its
  one-time batch search is reported separately; a second fit reads the cache);
- expert: the best point of the grid batch {32, 128, 256, 512} x precision
  {float32, mixed_bfloat16} x pipeline {plain, parallel map + prefetch}.

Goals (issue 4), on a bf16-capable CPU: kerascale >= 1.8x naive and >= 0.95x
expert on the reference workload, and never slower than naive on any workload.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import kerascale

BATCHES = (32, 128, 256, 512)
PRECISIONS = ("float32", "mixed_bfloat16")
PIPELINES = ("plain", "parallel")


def images(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, size=n).astype("int64")
    return x, y


def augment(image, label):
    image = tf.cast(image, tf.float32) / 255.0
    image = tf.image.random_flip_left_right(image)
    image = tf.image.resize_with_crop_or_pad(image, 40, 40)
    image = tf.image.random_crop(image, (32, 32, 3))
    image = tf.image.random_brightness(image, 0.2)
    return image, label


def small_cnn():
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return keras.Model(inputs, outputs)


def bn_heavy():
    inputs = keras.Input((32, 32, 3))
    h = inputs
    for i in range(6):
        h = keras.layers.Conv2D(64, 3, padding="same", use_bias=False)(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.Activation("relu")(h)
        if i in (1, 3):
            h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return keras.Model(inputs, outputs)


WORKLOADS = {"cnn": (small_cnn, 4096), "bn": (bn_heavy, 2048)}


def build(arch, policy="float32"):
    keras.utils.set_random_seed(0)
    previous = keras.config.dtype_policy().name
    keras.config.set_dtype_policy(policy)
    try:
        model = arch()
    finally:
        keras.config.set_dtype_policy(previous)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def pipeline(x, y, kind: str, batch: int):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if kind == "plain":
        return ds.map(augment).batch(batch)
    return (
        ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )


def timed_fit(model, ds, n, **kwargs):
    timer = EpochTimer()
    model.fit(ds, epochs=2, verbose=0, callbacks=[timer], **kwargs)
    return n / timer.seconds[-1]


def naive(arch, x, y):
    return timed_fit(build(arch), pipeline(x, y, "plain", 32), len(x))


def kerascale_defaults(arch, x, y):
    model = build(arch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment)
    start = time.perf_counter()
    plan = kerascale.plan(model, ds, verbose=0)  # the search, once; then cached
    setup = time.perf_counter() - start
    timer = EpochTimer()
    history = kerascale.fit(model, ds, epochs=2, verbose=0, callbacks=[timer])
    return len(x) / timer.seconds[-1], history.plan, setup, plan


def grid(arch, x, y):
    out = {}
    for batch, policy, kind in itertools.product(BATCHES, PRECISIONS, PIPELINES):
        model = build(arch, policy)
        out[f"{batch}/{policy}/{kind}"] = timed_fit(
            model, pipeline(x, y, kind, batch), len(x)
        )
    return out


def expert_config(arch, x, y, key):
    batch, policy, kind = key.split("/")
    return timed_fit(build(arch, policy), pipeline(x, y, kind, int(batch)), len(x))


def run(name: str, rounds: int) -> dict:
    arch, n = WORKLOADS[name]
    x, y = images(n)
    row = {"workload": name, "samples": n, "rounds": rounds}
    # kerascale's one-time cost: the batch search and the trials (then cached).
    _, plan, setup, _ = kerascale_defaults(arch, x, y)
    row["kerascale_setup_s"] = setup
    # The expert's grid, each point the median of rounds - 1 runs.
    runs = [grid(arch, x, y) for _ in range(max(1, rounds - 1))]
    row["grid"] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    best = max(row["grid"], key=row["grid"].get)
    row["expert_config"] = best
    # The contest: the three side by side, in rotating order, so that drift
    # and noise hit all alike; the expert's point is re-measured here rather
    # than taken as the maximum of 16 noisy grid figures (which flatters it).
    contestants = {
        "naive": lambda: naive(arch, x, y),
        "kerascale": lambda: kerascale_defaults(arch, x, y)[0],
        "expert": lambda: expert_config(arch, x, y, best),
    }
    measured = {k: [] for k in contestants}
    names = list(contestants)
    for i in range(rounds):
        for k in names[i % 3 :] + names[: i % 3]:
            measured[k].append(contestants[k]())
    for k, v in measured.items():
        row[k] = float(np.median(v))
        row[f"{k}_runs"] = v
    speed = row["kerascale"]
    row["kerascale_plan"] = {
        "batch": plan.global_batch_size,
        "precision": plan.precision,
        "data": list(plan.data_changes),
        "reasons": dict(plan.reasons),
    }
    row["kerascale_vs_naive"] = row["kerascale"] / row["naive"]
    row["kerascale_vs_expert"] = row["kerascale"] / row["expert"]
    print(
        f"{name}: naive {row['naive']:.0f}, kerascale {speed:.0f} "
        f"({plan.global_batch_size}/{plan.precision}), expert {row['expert']:.0f} "
        f"({best}) samples/s",
        flush=True,
    )
    return row


def markdown(rows) -> str:
    lines = [
        "| workload | naive | kerascale | kerascale chose | expert | expert config | "
        "vs naive | vs expert |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["kerascale_plan"]
        chose = f"{p['batch']}, {p['precision']}, {', '.join(p['data']) or 'as is'}"
        lines.append(
            f"| {r['workload']} | {r['naive']:.0f} | {r['kerascale']:.0f} | {chose} | "
            f"{r['expert']:.0f} | {r['expert_config']} | "
            f"{r['kerascale_vs_naive']:.2f} | {r['kerascale_vs_expert']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cnn,bn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    rows = [run(w, args.rounds) for w in args.workloads.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "end_to_end.json").write_text(json.dumps(rows, indent=2))
    table = markdown(rows)
    (out / "end_to_end.md").write_text(f"# End to end (samples/s)\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
