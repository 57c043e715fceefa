"""End to end as the user waits for it (issue 39): wall time, planning
included, from a fresh cache, against plain `model.fit` and an expert.

    .venv/bin/python benchmarks/wall_time.py [--workloads cnn]
        [--minutes 1,5] [--rounds 1]

The workloads are `end_to_end.py`'s (synthetic 32x32x3 uint8 images with an
augmenting `tf.data` map, Adam): `cnn`, the reference small CNN on 4096
images, and `bn`, six conv + BatchNorm blocks on 2048. For each run length
(about 1 and 5 minutes of plain `model.fit`, epochs set from a first timed
plain epoch), three contestants train the same epochs, each in its own
fresh model, timed from the model's build to `fit`'s return:

- plain: `model.fit(ds.map(augment).batch(32), epochs=E)`, what a user
  writes first (float32, batch 32, a serial map, no prefetch);
- expert: batch 256, `map(num_parallel_calls=AUTOTUNE)`, `prefetch(AUTOTUNE)`
  and `mixed_bfloat16` set as the global policy before the model is built
  (the configuration issue 39's expert used on this workload);
- kerascale: `kerascale.fit(model, ds.map(augment), epochs=E)` with every
  default, its cache in a new empty directory (its first run: the batch
  search, the trials, bf16's start, all in the time).

Goals (issue 39): kerascale never slower than plain on the 1-minute run and
at least 0.8 of the expert's speed (expert seconds / kerascale seconds);
at least 0.95 of the expert's on the 5-minute run. Writes
`benchmarks/results/wall_time.json`, with where each contestant's seconds
went (before training, first and median epoch, the slowest epochs, the end).
"""

from __future__ import annotations

import argparse
import itertools
import os
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

EXPERT = {"batch": 256, "precision": "mixed_bfloat16"}


class Clock(keras.callbacks.Callback):
    """Where a contestant's seconds went: the time before `fit`'s training
    starts (building, and kerascale's planning), each epoch, and the time
    from the last epoch's end to `fit`'s return. Epoch hooks only, so
    kerascale's steps per call are not held down by it."""

    def __init__(self, start: float):
        super().__init__()
        self.start, self.begin, self.ends = start, None, []

    def on_train_begin(self, logs=None):
        self.begin, self.ends = time.perf_counter(), []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())

    def split(self, returned: float) -> dict:
        marks = [self.begin, *self.ends]
        epochs = sorted(b - a for a, b in itertools.pairwise(marks))
        return {
            "before_s": round(self.begin - self.start, 2),
            "first_epoch_s": round(self.ends[0] - self.begin, 2),
            "median_epoch_s": round(epochs[len(epochs) // 2], 3),
            "slowest_epochs_s": [round(e, 2) for e in epochs[-3:]],
            "epochs_s": round(self.ends[-1] - self.begin, 1),
            "end_s": round(returned - self.ends[-1], 2),
        }


def plain(arch, x, y, epochs: int) -> tuple[float, dict]:
    start = time.perf_counter()
    clock = Clock(start)
    model = build(arch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment).batch(32)
    model.fit(ds, epochs=epochs, verbose=0, callbacks=[clock])
    returned = time.perf_counter()
    return returned - start, clock.split(returned)


def expert(arch, x, y, epochs: int) -> tuple[float, dict]:
    start = time.perf_counter()
    clock = Clock(start)
    model = build(arch, EXPERT["precision"])
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(EXPERT["batch"])
        .prefetch(tf.data.AUTOTUNE)
    )
    model.fit(ds, epochs=epochs, verbose=0, callbacks=[clock])
    returned = time.perf_counter()
    return returned - start, clock.split(returned)


def ours(arch, x, y, epochs: int) -> tuple[float, dict, dict]:
    with fresh_cache():
        start = time.perf_counter()
        clock = Clock(start)
        model = build(arch)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment)
        history = kerascale.fit(model, ds, epochs=epochs, verbose=0, callbacks=[clock])
        returned = time.perf_counter()
        seconds = returned - start
    plan = history.plan
    chose = {
        "batch": plan.global_batch_size,
        "precision": plan.precision,
        "data_changes": list(plan.data_changes.words()),
        "reasons": dict(plan.reasons),
        "steps_per_call": plan.steps_per_execution,
    }
    return seconds, clock.split(returned), chose


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="cnn")
    p.add_argument("--minutes", default="1,5")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    rows = []
    for name in args.workloads.split(","):
        arch, n = WORKLOADS[name]
        x, y = images(n)
        one_epoch = plain(arch, x, y, 2)[0] / 2  # the first epoch traces: 2 averaged
        for minutes in map(float, args.minutes.split(",")):
            epochs = max(1, round(minutes * 60 / one_epoch))
            for r in range(args.rounds):
                order = [plain, expert, ours] if r % 2 == 0 else [ours, expert, plain]
                seconds, splits, chose = {}, {}, None
                for contestant in order:
                    keras.utils.set_random_seed(0)
                    if contestant is ours:
                        seconds["kerascale"], splits["kerascale"], chose = ours(
                            arch, x, y, epochs
                        )
                    else:
                        key = contestant.__name__
                        seconds[key], splits[key] = contestant(arch, x, y, epochs)
                row = {
                    "workload": name,
                    "minutes": minutes,
                    "epochs": epochs,
                    "round": r + 1,
                    **{f"{k}_s": round(v, 1) for k, v in seconds.items()},
                    "vs_plain": round(seconds["plain"] / seconds["kerascale"], 3),
                    "vs_expert": round(seconds["expert"] / seconds["kerascale"], 3),
                    "chose": chose,
                    "splits": splits,
                }
                rows.append(row)
                changes = ", ".join(chose["data_changes"]) or "as is"
                print(
                    f"{name}, {epochs} epochs (~{minutes:g} min): plain "
                    f"{seconds['plain']:.1f}s, expert {seconds['expert']:.1f}s, "
                    f"kerascale {seconds['kerascale']:.1f}s (batch {chose['batch']}, "
                    f"{chose['precision']}, {changes}"
                    f"): {row['vs_plain']:.2f}x plain's speed, {row['vs_expert']:.2f} "
                    "of the expert's",
                    flush=True,
                )
                for key, split in splits.items():
                    print(f"  {key}: {split}", flush=True)
    write("wall_time", expert=EXPERT, rows=rows)


if __name__ == "__main__":
    main()
