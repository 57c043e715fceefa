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
`benchmarks/results/wall_time.json`.
"""

from __future__ import annotations

import argparse
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


def plain(arch, x, y, epochs: int) -> float:
    start = time.perf_counter()
    model = build(arch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment).batch(32)
    model.fit(ds, epochs=epochs, verbose=0)
    return time.perf_counter() - start


def expert(arch, x, y, epochs: int) -> float:
    start = time.perf_counter()
    model = build(arch, EXPERT["precision"])
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(EXPERT["batch"])
        .prefetch(tf.data.AUTOTUNE)
    )
    model.fit(ds, epochs=epochs, verbose=0)
    return time.perf_counter() - start


def ours(arch, x, y, epochs: int) -> tuple[float, dict]:
    with fresh_cache():
        start = time.perf_counter()
        model = build(arch)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment)
        history = kerascale.fit(model, ds, epochs=epochs, verbose=0)
        seconds = time.perf_counter() - start
    plan = history.plan
    chose = {
        "batch": plan.global_batch_size,
        "precision": plan.precision,
        "data_changes": list(plan.data_changes.words()),
        "reasons": dict(plan.reasons),
    }
    return seconds, chose


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
        one_epoch = plain(arch, x, y, 2) / 2  # the first epoch traces: 2 averaged
        for minutes in map(float, args.minutes.split(",")):
            epochs = max(1, round(minutes * 60 / one_epoch))
            for r in range(args.rounds):
                order = [plain, expert, ours] if r % 2 == 0 else [ours, expert, plain]
                seconds, chose = {}, None
                for contestant in order:
                    keras.utils.set_random_seed(0)
                    if contestant is ours:
                        seconds["kerascale"], chose = ours(arch, x, y, epochs)
                    else:
                        seconds[contestant.__name__] = contestant(arch, x, y, epochs)
                row = {
                    "workload": name,
                    "minutes": minutes,
                    "epochs": epochs,
                    "round": r + 1,
                    **{f"{k}_s": round(v, 1) for k, v in seconds.items()},
                    "vs_plain": round(seconds["plain"] / seconds["kerascale"], 3),
                    "vs_expert": round(seconds["expert"] / seconds["kerascale"], 3),
                    "chose": chose,
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
    write("wall_time", expert=EXPERT, rows=rows)


if __name__ == "__main__":
    main()
