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


def _data():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(2048, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=2048)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(2)


def side_by_side(contestants: dict, rounds: int) -> dict:
    """Runs each contestant (a function of a StepTimer) once to warm up, then
    `rounds` times, alternating who goes first. Ratios are second / first."""
    (a, _), (b, _) = contestants.items()
    steps = {k: [] for k in contestants}
    setup = {k: [] for k in contestants}
    ratios = []
    for fn in contestants.values():
        fn(StepTimer())  # warm-up: tracing, caches
    for r in range(rounds):
        per_round = {}
        order = list(contestants.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            timer = StepTimer()
            start = time.perf_counter()
            fn(timer)
            steps[name] += timer.times
            # Everything before the first step: planning, data, Keras's setup.
            setup[name].append(timer.first_batch_at - start)
            per_round[name] = statistics.median(timer.times)
        ratios.append(per_round[b] / per_round[a])
    med = {k: statistics.median(v) for k, v in steps.items()}
    return {
        "rounds": rounds,
        "steps_measured": {k: len(v) for k, v in steps.items()},
        "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        # The median of the per-round ratios: each round's pair ran back to
        # back, so slow patches of the machine cancel out.
        "step_time_ratio": round(statistics.median(ratios), 4),
        "ratio_of_medians": round(med[b] / med[a], 4),
        "round_ratios_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
        "per_call_setup_s": {
            k: round(statistics.median(v), 4) for k, v in setup.items()
        },
    }


def overhead(rounds: int) -> dict:
    """kerascale.fit pinned to model.fit's choices, against model.fit."""
    ds = _data()
    keras.utils.set_random_seed(0)
    plain, scaled = cnn(), cnn()
    scaled.set_weights(plain.get_weights())
    result = side_by_side(
        {
            "keras": lambda t: plain.fit(
                ds, epochs=1, verbose=0, shuffle=False, callbacks=[t]
            ),
            "kerascale": lambda t: kerascale.fit(
                scaled,
                ds,
                batch_size=64,
                precision="float32",
                strategy="default",
                optimize_data=False,
                epochs=1,
                verbose=0,
                callbacks=[t],
            ),
        },
        rounds,
    )
    result["workload"] = "CNN 32x32x3 -> 10, 2048 samples, batch 64, Adam, float32"
    result["goal"] = "<= 1.03"
    return result


def precision(rounds: int) -> dict:
    """kerascale.fit's automatic precision against float32, all else equal."""
    ds = _data()
    keras.utils.set_random_seed(0)
    model = cnn()
    auto_plan = kerascale.plan(model, ds, optimize_data=False)
    common = dict(batch_size=64, optimize_data=False, epochs=1, verbose=0)
    result = side_by_side(
        {
            "float32": lambda t: kerascale.fit(
                model, ds, precision="float32", callbacks=[t], **common
            ),
            "auto": lambda t: kerascale.fit(
                model, ds, precision="auto", callbacks=[t], **common
            ),
        },
        rounds,
    )
    result["workload"] = "CNN 32x32x3 -> 10, 2048 samples, batch 64, Adam"
    result["auto_policy"] = auto_plan.precision
    result["auto_reason"] = auto_plan.reasons["precision"]
    result["goal"] = "< 1.0 when auto picks a mixed policy"
    return result


def _table(result: dict, names: tuple[str, str]) -> list[str]:
    lines = [
        "| | median step (ms) | steps | setup per call (s) |",
        "|---|---|---|---|",
    ]
    for k in names:
        lines.append(
            f"| {k} | {result['median_step_ms'][k]} | "
            f"{result['steps_measured'][k]} | {result['per_call_setup_s'][k]} |"
        )
    lo, hi = result["round_ratios_min_max"]
    lines += [
        "",
        f"**Step-time ratio {names[1]} / {names[0]}: {result['step_time_ratio']}** "
        f"(goal {result['goal']}; median of per-round ratios, which ranged "
        f"{lo}-{hi}; ratio of overall medians {result['ratio_of_medians']})",
        "",
    ]
    return lines


def markdown(results: dict) -> str:
    o, p = results["overhead"], results["precision"]
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
        *_table(o, ("keras", "kerascale")),
        "## Precision (kerascale.fit, auto against float32)",
        "",
        f"Workload: {p['workload']}; {p['rounds']} alternating rounds. Auto picked "
        f"{p['auto_policy']}: {p['auto_reason']}.",
        "",
        *_table(p, ("float32", "auto")),
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
        "precision": precision(args.rounds),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
