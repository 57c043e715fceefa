"""Batch-size search benchmark: kerascale's search against the truth, and
against Lightning's.

    python benchmarks/batch_search.py [--limit 2GiB] [--lightning]
        [--precisions float32,mixed_bfloat16] [--out benchmarks/results]

For two models under the same real resident-memory limit (child processes
watched as `find_batch_size` watches them on CPU: what a container counts),
it reports:

- the batch kerascale's search found, against the true largest batch: the
  largest whose peak resident memory stays under the limit, found by
  bisection with fresh children that run with no limit at all and report
  their peak (Linux's VmHWM), so the truth does not depend on kerascale's
  own enforcement;
- the number of probes and the seconds the search took;
- with --lightning, the same for Lightning's algorithm (below).

The baseline is Lightning's `scale_batch_size(mode="binsearch")` algorithm,
written here as the reference: start at 2, double until a batch runs out of
memory, then bisect between the last success and the failure until they are 1
apart. Both run on the same probes (same child processes, same limit), each
with its own stopping rule: kerascale as `find_batch_size` runs it on a CPU
(granularity 8 above a cap of 1024, the boundary resolved to 1% because a 3%
safety margin follows), Lightning to one sample.

The true largest batch L is the boundary Lightning reports; it is then verified
with fresh, independent probes at L-1, L, L+1 and L+2 (fits, fits, does not,
does not) rather than by probing every batch from 1, which would take hours
and prove nothing more for a memory use that grows with the batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

from kerascale._units import parse_bytes
from kerascale.measure import child, probe, probe_data
from kerascale.measure.request import DEFAULT_MARGIN
from kerascale.measure.search import granularity_for, search
from kerascale.sense import data_facts


def convnet():
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model, (32, 32, 3)


def mlp():
    inputs = keras.Input((3072,))  # 32x32x3 images, flattened
    h = keras.layers.Dense(2048, activation="relu")(inputs)
    h = keras.layers.Dense(2048, activation="relu")(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model, (3072,)


def lightning_binsearch(run, *, init=2, max_trials=25):
    """Lightning's binsearch scaling, probe for probe."""
    low, high, size, count = 1, None, init, 0
    while count < max_trials:
        count += 1
        if run(size).outcome == "ok":
            low = size
            if high:
                if high - low <= 1:
                    break
                size = (high + low) // 2
            else:
                size *= 2
        else:
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
    return low


def rss_truth(model, spec, limit, fits, fails):
    """The largest batch whose peak resident memory, in a fresh child with
    no limit, is at most `limit`: bisection between a batch that fits and
    one that does not. Returns (truth, probes)."""
    free = dataclasses.replace(spec, memory_limit=None)
    count = 0
    with child.IsolatedProber(model, free) as prober:

        def under(b):
            nonlocal count
            count += 1
            r = prober(b)
            return r.outcome == "ok" and r.peak_bytes <= limit

        while not under(fits):
            fits, fails = fits // 2, fits
        while fails is None or under(fails):
            fits, fails = (fails or fits), (fails or fits) * 2
        while fails - fits > 1:
            mid = (fits + fails) // 2
            if under(mid):
                fits = mid
            else:
                fails = mid
    return fits, count


def measure(name, build, limit, cap, policy="float32", lightning=False):
    keras.utils.set_random_seed(0)
    model, shape = build()
    x = np.zeros((1, *shape), "float32")
    y = np.zeros(1, "int64")
    element = data_facts.element_structure(x, y, data_facts.inspect(x, y))
    spec = probe.ProbeSpec(
        element=probe_data.encode_structure(element), memory_limit=limit, policy=policy
    )
    row = {"model": name, "precision": policy, "limit_bytes": limit}
    with child.IsolatedProber(model, spec) as prober:
        start = time.perf_counter()
        found = search(
            prober,
            cap=cap,
            limit_bytes=limit,
            granularity=granularity_for("cpu", cap),
            margin=DEFAULT_MARGIN,
            sweep=prober.sweep,
        )
        row["kerascale"] = {
            "found": found.largest_fitting,
            "bracket": [found.largest_fitting, found.smallest_failing],
            "chosen": found.batch_size,
            "probes": len(found.probes),
            "seconds": round(time.perf_counter() - start, 1),
            "sequence": [p.batch for p in found.probes],
        }
        if not lightning:
            truth, count = rss_truth(
                model, spec, limit, found.largest_fitting, found.smallest_failing
            )
            row["true_largest"] = truth
            row["truth_probes"] = count
            row["chosen_vs_truth"] = round(found.batch_size / truth, 3)
            row["found_vs_truth"] = round(found.largest_fitting / truth, 3)
            return row
        seen = []

        def run(b):
            r = prober(b)
            seen.append(r)
            return r

        start = time.perf_counter()
        low = lightning_binsearch(run)
        row["lightning_binsearch"] = {
            "found": low,
            "probes": len(seen),
            "seconds": round(time.perf_counter() - start, 1),
            "sequence": [p.batch for p in seen],
        }
        truth = low
        checks = {
            b: prober(b).outcome for b in (truth - 1, truth, truth + 1, truth + 2)
        }
        row["verification"] = checks
        row["true_largest"] = (
            truth if list(checks.values()) == ["ok", "ok", "oom", "oom"] else None
        )
    return row


def truth_markdown(rows) -> str:
    lines = [
        "| model | precision | true largest (RSS, no limit) | kerascale fits / fails "
        "| chosen (3% margin) | chosen / truth | probes | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        k = r["kerascale"]
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['true_largest']} | "
            f"{k['bracket'][0]} / {k['bracket'][1]} | {k['chosen']} | "
            f"{r['chosen_vs_truth']} | {k['probes']} | {k['seconds']} |"
        )
    return "\n".join(lines)


def markdown(rows) -> str:
    lines = [
        "| model | true largest | kerascale fits / fails | chosen (3% margin) | "
        "probes | s | Lightning found | probes | s | probe ratio | time ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        k, b = r["kerascale"], r["lightning_binsearch"]
        lines.append(
            f"| {r['model']} | {r['true_largest']} | {k['bracket'][0]} / "
            f"{k['bracket'][1]} | {k['chosen']} | {k['probes']} | "
            f"{k['seconds']} | {b['found']} | {b['probes']} | {b['seconds']} | "
            f"{k['probes'] / b['probes']:.2f} | {k['seconds'] / b['seconds']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="2GiB")
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument(
        "--lightning", action="store_true", help="compare with Lightning instead"
    )
    parser.add_argument("--cap", type=int, default=16384)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    limit = parse_bytes("--limit", args.limit)
    models = (("convnet", convnet), ("mlp", mlp))
    if args.lightning:
        rows = [measure(n, b, limit, args.cap, lightning=True) for n, b in models]
    else:
        rows = [
            measure(n, b, limit, args.cap, policy)
            for policy in args.precisions.split(",")
            for n, b in models
        ]
        for row in rows:
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch_search.json").write_text(json.dumps(rows, indent=2))
    table = markdown(rows) if args.lightning else truth_markdown(rows)
    (out / "batch_search.md").write_text(
        f"# Batch-size search, limit {args.limit} (resident memory, CPU)\n\n{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
