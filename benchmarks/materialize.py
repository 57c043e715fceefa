"""Materialized input (`kerascale.data.materialize`) on an input-bound job
that decodes JPEG files from disk: epoch 2+ throughput before and after,
bytes on disk per sample, and a kill while writing.

    .venv/bin/python benchmarks/materialize.py [--images 1200] [--epochs 3]

The files: IMAGES JPEGs of 320 x 320 (smooth random images, about a photo's
compression) in a temporary folder. The baseline is what a competent user
writes, and what `kerascale.data.optimize` gives: `list_files`, the decode
and resize to 224 x 224 in a parallel map (AUTOTUNE), a shuffle, a random
flip in a parallel map, batch 64, prefetch(AUTOTUNE). After: the same
pipeline through `materialize` (the decode runs once; the shuffle, flip,
batch and prefetch run on what is read back).

Measured per epoch: the pipeline alone (samples/s iterating it), and
`model.fit` of a small CNN on it (samples/s), in one process, epoch 1 apart
(after materializing, epoch 1 is the writing). `cache()` in memory is
reported too: where the decoded data fits in RAM it is the other answer,
but it is rebuilt by every process (every run, every worker).

Then a writer process is killed (SIGKILL) half-way, and the next run is
checked to write the set again rather than read what was left.
Writes benchmarks/results/materialize.json.
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import _results  # benchmarks/_results.py
import numpy as np
import tensorflow as tf

import kerascale

SIDE, OUT, BATCH = 320, 224, 64


def make_images(folder, n):
    rng = np.random.default_rng(0)
    for i in range(n):
        low = rng.integers(0, 255, (SIDE // 16, SIDE // 16, 3)).astype(np.float32)
        img = tf.image.resize(low[None], (SIDE, SIDE), "bicubic")[0]
        img = tf.clip_by_value(img + rng.normal(0, 6, img.shape), 0, 255)
        tf.io.write_file(
            str(folder / f"{i:05d}.jpg"), tf.io.encode_jpeg(tf.cast(img, tf.uint8))
        )


def decode(path):
    pixels = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    pixels = tf.cast(tf.image.resize(pixels, (OUT, OUT)), tf.uint8)
    label = tf.strings.to_number(tf.strings.substr(path, -9, 5), tf.int32) % 10
    return pixels, label


def flip(x, y):
    return tf.image.random_flip_left_right(x), y


def pipeline(folder, cache=False):
    files = tf.data.Dataset.list_files(str(folder / "*.jpg"), shuffle=False)
    ds = files.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        ds = ds.cache()
    ds = ds.shuffle(1000, seed=0).map(flip, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def model():
    keras = tf.keras
    inputs = keras.Input((OUT, OUT, 3), dtype="uint8")
    h = keras.layers.Rescaling(1 / 255)(inputs)
    h = keras.layers.Conv2D(8, 3, strides=4, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    m = keras.Model(inputs, keras.layers.Dense(10)(h))
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def epochs_read(ds, n, epochs):
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        for _ in ds:
            pass
        rates.append(n / (time.perf_counter() - start))
    return rates


def epochs_fit(ds, n, epochs):
    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            rates.append(n / (time.perf_counter() - self.start))

    rates = []
    model().fit(ds, epochs=epochs, verbose=0, callbacks=[Timer()])
    return rates


def killed_writer(folder, shards):
    """A writer killed half-way (SIGKILL while its set is still under its
    temporary name; tried again sooner if it finished first); what the next
    run did."""
    here = str(pathlib.Path(__file__).parent)
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import materialize as b, "
        "pathlib, kerascale; kerascale.data.materialize("
        f"b.pipeline(pathlib.Path({str(folder)!r})), {str(shards)!r}, verbose=0)"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for delay in (0.3, 0.1, 0.0):
        shutil.rmtree(shards, ignore_errors=True)
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        while not any(n.startswith(".partial-") for n in _names(shards)):
            time.sleep(0.02)
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        left = sorted(_names(shards))
        if all(n.startswith(".partial-") for n in left):
            break  # killed while writing
    again = kerascale.data.materialized(pipeline(folder), shards)
    return {
        "left_by_the_kill": left,
        "next_run_reused": again.reused,
        "next_run_elements": again.elements,
        "after": sorted(_names(shards)),
    }


def _names(folder):
    return os.listdir(folder) if os.path.isdir(folder) else []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="kerascale-jpeg-"))
    try:
        folder = root / "images"
        folder.mkdir()
        make_images(folder, args.images)
        jpeg_bytes = sum(f.stat().st_size for f in folder.iterdir())
        n, e = args.images, args.epochs
        rows = {}
        rows["as written (parallel map, prefetch)"] = {
            "read": epochs_read(pipeline(folder), n, e),
            "fit": epochs_fit(pipeline(folder), n, e),
        }
        rows["cache() in memory"] = {
            "read": epochs_read(pipeline(folder, cache=True), n, e),
            "fit": epochs_fit(pipeline(folder, cache=True), n, e),
        }
        shards = root / "shards"
        start = time.perf_counter()
        done = kerascale.data.materialized(pipeline(folder), shards)
        write = time.perf_counter() - start
        print(done.describe())
        again = kerascale.data.materialized(pipeline(folder), shards)
        assert again.reused
        rows["materialized"] = {
            "read": [n / write, *epochs_read(again.dataset, n, e - 1)],
            "fit": epochs_fit(again.dataset, n, e),
        }
        base = rows["as written (parallel map, prefetch)"]
        summary = {}
        for name, r in rows.items():
            summary[name] = {
                kind: {
                    "samples_per_s": [round(v, 1) for v in r[kind]],
                    "epoch_2plus_vs_as_written": round(
                        np.mean(r[kind][1:]) / np.mean(base[kind][1:]), 2
                    ),
                }
                for kind in ("read", "fit")
            }
            print(name, json.dumps(summary[name]), flush=True)
        kill = killed_writer(folder, root / "killed")
        print("kill while writing:", json.dumps(kill), flush=True)
        _results.write(
            "materialize",
            images=n,
            jpeg_bytes_per_sample=round(jpeg_bytes / n),
            shard_bytes_per_sample=round(done.bytes / done.elements),
            write_seconds=round(write, 1),
            rows=summary,
            kill=kill,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
