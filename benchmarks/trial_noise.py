"""How long a trial's timed window must be: the noise of the per-round gain
between two candidates, against the window's length, on this machine.

    python benchmarks/trial_noise.py [--windows 0.2,0.6,1.5] [--repeats 4]

On the end-to-end reference workload (small CNN, 4096 augmented images, batch
128, parallel pipeline), the precision stage's two candidates (float32 and
mixed_bfloat16) are prepared once and timed in kerascale's 3 interleaved
rounds, `--repeats` times per window length. Reported per window: the median
half-range of the per-round gains (what a decision must exceed), the spread
of the mean gain between repeats, and the seconds one stage's timing took.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).parent))
from end_to_end import augment, build, images, small_cnn

import kerascale
from kerascale.measure import trial_bench, trials
from kerascale.measure.request import Given
from kerascale.sense import data_facts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="0.2,0.6,1.5")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args(argv)
    x, y = images(4096)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(augment)
    model = build(small_cnn)
    plan = kerascale.plan(
        model,
        ds,
        batch_size=128,
        precision="mixed_bfloat16",
        optimize_data=True,
        verbose=0,
    )
    data = data_facts.inspect(ds, None)
    keys = [(128, "float32", True), (128, "mixed_bfloat16", True)]
    print("window | half-range of per-round gains (median) | mean gains | timing s")
    for window in (float(w) for w in args.windows.split(",")):
        trial_bench.WINDOW_SECONDS = window
        bench = trial_bench.Bench(Given(model, ds), data, plan, verbose=0)
        bench.budget_for(None, True, None)
        noise, gains, seconds = [], [], []
        with bench:
            for k in keys:
                bench._prepare(k)
            for _ in range(args.repeats):
                start = time.perf_counter()
                f32, bf16 = bench.compare(keys, "precision")
                seconds.append(time.perf_counter() - start)
                gain, half_range, _ = trials._paired(f32, bf16)
                noise.append(half_range)
                gains.append(gain)
        print(
            f"{window:.1f} s | {statistics.median(noise):.1%} | "
            + ", ".join(f"{g:+.1%}" for g in gains)
            + f" | {statistics.median(seconds):.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
