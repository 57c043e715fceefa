"""Where a CPU probe runs, measured (issue 57): the same searches with their
probes in this process while `measure.headroom` admits them, in children
forked from one server that imported TensorFlow once (`measure.fork_server`),
and in children that each start a TensorFlow of their own.

Two searches, each from a fresh cache, rounds alternating in one process:
- the speed ladder of `find_batch_size(mode="throughput")` (no
  memory_limit; a CPU `fit` probes nothing before the run since issue 78):
  in this process first (`isolate="auto"`), in forked children, in fresh
  children (`isolate=True`);
- the largest batch under a real resident-memory limit (`memory_limit`),
  which only a child can hold to: forked against fresh children.

    .venv/bin/python benchmarks/probe_placement.py [--rounds 2] [--limit 1400MiB]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from _results import write

import kerascale
from kerascale.measure import placement


def cnn() -> keras.Model:
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def run(case: str, x, y, limit: str) -> tuple[float, int, int]:
    """(seconds, answer, probes) of one search."""
    fork = not case.endswith("fresh children")
    placement.FORK_ON_CPU = fork
    try:
        kw = (
            {"memory_limit": limit, "isolate": True}
            if case.startswith("limit")
            else {"mode": "throughput", "isolate": "auto" if "here" in case else True}
        )
        start = time.perf_counter()
        r = kerascale.find_batch_size(
            cnn(), x, y, cache=False, verbose=0, precision="float32", **kw
        )
        return time.perf_counter() - start, r.batch_size, len(r.probes)
    finally:
        placement.FORK_ON_CPU = True


CASES = (
    "ladder: here first",
    "ladder: forked children",
    "ladder: fresh children",
    "limit: forked children",
    "limit: fresh children",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", default="1400MiB")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 4096)
    seen: dict[str, list[tuple[float, int, int]]] = {c: [] for c in CASES}
    for i in range(args.rounds):
        for case in CASES if i % 2 == 0 else CASES[::-1]:
            seen[case].append(run(case, x, y, args.limit))
            print(case, seen[case][-1], flush=True)
    rows = {}
    print("\n| search | probes in | seconds (median) | answer | probes |")
    print("|---|---|---|---|---|")
    for case, runs in seen.items():
        search, where = case.split(": ")
        sec = statistics.median(r[0] for r in runs)
        answers = sorted({r[1] for r in runs})
        probes = sorted({r[2] for r in runs})
        rows[case] = {"seconds": sec, "answers": answers, "probes": probes}
        print(f"| {search} | {where} | {sec:.1f} | {answers} | {probes} |")
    write("probe_placement", rounds=args.rounds, limit=args.limit, rows=rows)


if __name__ == "__main__":
    main()
