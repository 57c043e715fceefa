"""Repeated calls: `kerascale.fit(model, ..., epochs=1)` ten times on one
model against `model.fit(..., epochs=1)` ten times (issue 25's bar: at most
1.2x). Code that calls `fit` in a loop (Keras's own early-stopping tests,
notebooks re-running a cell) must not pay for planning, re-creation or
tracing each time. Both sides use the same precision (kerascale's plan's,
set by Keras's global policy for the plain side) and batch, alternate
rounds in one process, and the ratio of medians is reported.

    .venv/bin/python benchmarks/repeated_calls.py [--rounds 5] [--calls 10]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import kerascale


def model() -> keras.Model:
    m = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    m.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return m


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 32)).astype("float32")
    y = rng.integers(0, 10, 512)
    policy = kerascale.plan(model(), x, y, batch_size=32, verbose=0).precision

    def ours() -> float:
        m = model()
        start = time.perf_counter()
        for _ in range(args.calls):
            kerascale.fit(m, x, y, batch_size=32, epochs=1, verbose=0)
        return time.perf_counter() - start

    def plain() -> float:
        keras.config.set_dtype_policy(policy)
        try:
            m = model()
        finally:
            keras.config.set_dtype_policy("float32")
        start = time.perf_counter()
        for _ in range(args.calls):
            m.fit(x, y, batch_size=32, epochs=1, verbose=0)
        return time.perf_counter() - start

    ours(), plain()  # warm-up: imports, first traces of Keras's own code
    times: dict[str, list[float]] = {"kerascale": [], "plain": []}
    for _ in range(args.rounds):
        times["kerascale"].append(ours())
        times["plain"].append(plain())
    ratio = statistics.median(times["kerascale"]) / statistics.median(times["plain"])
    result = {
        "precision": policy,
        "calls": args.calls,
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "ratio_of_medians": round(ratio, 3),
    }
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "repeated_calls.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
