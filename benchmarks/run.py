"""kerascale benchmarks: one command, JSON plus a markdown table.

    python benchmarks/run.py [--rounds 7] [--out benchmarks/results]

overhead: `kerascale.fit` with every decision pinned to what `model.fit` does
(same batch, float32, the default strategy, the data untouched), against
`model.fit`, side by side in one process. Rounds alternate A, B, B, A, ... so
that drift in the machine's speed hits both alike. Each figure is the median
steady-state step time (the first steps of each call are skipped, so tracing
is not counted); the ratio is kerascale / keras, goal <= 1.03. The fixed cost
per `kerascale.fit` call (planning) is reported separately, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import kerascale

SKIP_STEPS = 5


class StepTimer(keras.callbacks.Callback):
    """Median step time after the first SKIP_STEPS steps of each call."""

    def on_train_begin(self, logs=None):
        self.times, self._t = [], None
        self.first_batch_at = None

    def on_train_batch_begin(self, batch, logs=None):
        self._t = time.perf_counter()
        if self.first_batch_at is None:
            self.first_batch_at = self._t

    def on_train_batch_end(self, batch, logs=None):
        if batch >= SKIP_STEPS:
            self.times.append(time.perf_counter() - self._t)


def cnn():
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, activation="relu", padding="same")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, activation="relu", padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def overhead(rounds: int) -> dict:
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(2048, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=2048)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(2)
    keras.utils.set_random_seed(0)
    plain, scaled = cnn(), cnn()
    scaled.set_weights(plain.get_weights())

    def run_keras():
        t = StepTimer()
        start = time.perf_counter()
        plain.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[t])
        return t, start

    def run_kerascale():
        t = StepTimer()
        start = time.perf_counter()
        kerascale.fit(
            scaled,
            ds,
            batch_size=64,
            precision="float32",
            strategy="default",
            optimize_data=False,
            epochs=1,
            verbose=0,
            callbacks=[t],
        )
        return t, start

    steps = {"keras": [], "kerascale": []}
    setup = {"keras": [], "kerascale": []}
    ratios = []
    run_keras(), run_kerascale()  # warm-up: tracing, caches
    for r in range(rounds):
        per_round = {}
        order = [("keras", run_keras), ("kerascale", run_kerascale)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            timer, start = fn()
            steps[name] += timer.times
            # Everything before the first step: planning, data, Keras's setup.
            setup[name].append(timer.first_batch_at - start)
            per_round[name] = statistics.median(timer.times)
        ratios.append(per_round["kerascale"] / per_round["keras"])
    med = {k: statistics.median(v) for k, v in steps.items()}
    return {
        "workload": "CNN 32x32x3 -> 10, 2048 samples, batch 64, Adam, float32",
        "rounds": rounds,
        "steps_measured": {k: len(v) for k, v in steps.items()},
        "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        # The median of the per-round ratios: each round's pair ran back to
        # back, so slow patches of the machine cancel out.
        "step_time_ratio": round(statistics.median(ratios), 4),
        "ratio_of_medians": round(med["kerascale"] / med["keras"], 4),
        "round_ratios_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
        "goal": "<= 1.03",
        "per_call_setup_s": {
            k: round(statistics.median(v), 4) for k, v in setup.items()
        },
    }


def markdown(results: dict) -> str:
    o = results["overhead"]
    lines = [
        "# kerascale benchmarks",
        "",
        f"Machine: {results['machine']}. TensorFlow {results['tensorflow']}, "
        f"Keras {results['keras']}.",
        "",
        "## Overhead (kerascale.fit pinned to model.fit's choices)",
        "",
        f"Workload: {o['workload']}; {o['rounds']} alternating rounds.",
        "",
        "| | median step (ms) | steps | setup per call (s) |",
        "|---|---|---|---|",
    ]
    for k in ("keras", "kerascale"):
        lines.append(
            f"| {k} | {o['median_step_ms'][k]} | {o['steps_measured'][k]} | "
            f"{o['per_call_setup_s'][k]} |"
        )
    lines += [
        "",
        f"**Step-time ratio kerascale / keras: {o['step_time_ratio']}** (goal "
        f"{o['goal']}; median of per-round ratios, which ranged "
        f"{o['round_ratios_min_max'][0]}-{o['round_ratios_min_max'][1]}; ratio "
        f"of overall medians {o['ratio_of_medians']})",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1. Received: --rounds={args.rounds}")
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"{kerascale.detect_hardware().summary()}",
        "python": sys.version.split()[0],
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "overhead": overhead(args.rounds),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
