"""tf.data's autotuning off on the pipelines kerascale prepares (issue 59,
fourth sitting): what it saves at each epoch's start and at the end of `fit`.

    .venv/bin/python benchmarks/autotune.py [--epochs 30] [--rounds 2]
    KERAS_BACKEND=jax .venv/bin/python benchmarks/autotune.py --epochs 8

The workload is `end_to_end.py`'s reference CNN on 4096 synthetic images
with the augmenting map, at batch 256 in float32 (both pinned, so that only
the input differs). Three contestants, each a fresh model from the same
seed, in alternating order each round:

- plain: `model.fit(ds.map(augment, num_parallel_calls=AUTOTUNE).batch(256)
  .prefetch(AUTOTUNE))`, a competent user's pipeline, autotuned;
- kerascale, autotuning kept on: `kerascale.fit(model, ds.map(augment),
  batch_size=256, precision="float32")` with the pipeline's autotuning
  taken as set by the user (`data_facts.autotune_set` patched to True), so
  kerascale leaves it on (the same pipeline changes otherwise);
- kerascale: the same call as it ships.

Each prints the run's seconds (planning included for kerascale's), the mean
epoch after the first, its first step's mean and median milliseconds, and
the seconds from the last epoch's end to `fit`'s return (Keras drops the
run's last iterator there). Writes `benchmarks/results/autotune_<backend>.json`.
The contestants' epoch clock has a batch hook, so kerascale runs one step a
call here, as plain `fit` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras
import tensorflow as tf
from _results import write
from end_to_end import WORKLOADS, augment, build, fresh_cache, images

import kerascale
from kerascale.sense import data_facts

BATCH = 256


class EpochClock(keras.callbacks.Callback):
    """Each epoch's seconds and its first step's."""

    def __init__(self):
        super().__init__()
        self.epochs, self.first = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._first = time.perf_counter(), None

    def on_train_batch_end(self, batch, logs=None):
        if self._first is None:
            self._first = time.perf_counter() - self._start

    def on_epoch_end(self, epoch, logs=None):
        self.last = time.perf_counter()
        self.epochs.append(self.last - self._start)
        self.first.append(self._first or 0.0)


def plain(arch, x, y, epochs: int, clock: EpochClock) -> tuple[float, str]:
    start = time.perf_counter()
    model = build(arch)
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    model.fit(ds, epochs=epochs, verbose=0, callbacks=[clock])
    clock.returned = time.perf_counter()
    return clock.returned - start, "as given"


def ours(arch, x, y, epochs: int, clock: EpochClock, *, off: bool) -> tuple[float, str]:
    shipped = data_facts.autotune_set
    if not off:
        data_facts.autotune_set = lambda ds: True
    try:
        with fresh_cache():
            start = time.perf_counter()
            model = build(arch)
            ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment)
            history = kerascale.fit(
                model,
                ds,
                batch_size=BATCH,
                precision="float32",
                epochs=epochs,
                verbose=0,
                callbacks=[clock],
            )
            clock.returned = time.perf_counter()
            seconds = clock.returned - start
    finally:
        data_facts.autotune_set = shipped
    return seconds, str(history.plan.data_changes)


CONTESTANTS = {
    "plain": plain,
    "kerascale, autotuning kept on": lambda *a: ours(*a, off=False),
    "kerascale": lambda *a: ours(*a, off=True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    arch, n = WORKLOADS["cnn"]
    x, y = images(n)
    rows = []
    for r in range(args.rounds):
        names = list(CONTESTANTS)
        for name in names if r % 2 == 0 else names[::-1]:
            keras.utils.set_random_seed(0)
            clock = EpochClock()
            seconds, changes = CONTESTANTS[name](arch, x, y, args.epochs, clock)
            later = clock.first[1:]
            usual = statistics.median(later)
            row = {
                "round": r + 1,
                "contestant": name,
                "seconds": round(seconds, 2),
                "mean_epoch_s": round(statistics.mean(clock.epochs[1:]), 3),
                "median_first_step_ms": round(usual * 1e3),
                "mean_first_step_ms": round(statistics.mean(later) * 1e3),
                "end_s": round(clock.returned - clock.last, 2),
                "data": changes,
            }
            rows.append(row)
            print(
                f"round {r + 1}, {name}: {seconds:.1f}s, an epoch "
                f"{row['mean_epoch_s']:.3f}s, its first step "
                f"{row['mean_first_step_ms']} ms "
                f"(median {row['median_first_step_ms']} ms), the end "
                f"{row['end_s']:.2f}s; data: {changes}",
                flush=True,
            )
    backend = keras.backend.backend()
    write(f"autotune_{backend}", epochs=args.epochs, batch=BATCH, rows=rows)


if __name__ == "__main__":
    main()
