"""The JAX batch search (XLA's memory analysis of the compiled step) against
the truth, on this CPU, in float32 and bf16.

Run in the JAX environment (README, "On the JAX backend"):

    .venv-jax/bin/python benchmarks/jax_batch_search.py [--limit BYTES] [--devices N]

With --devices N (N > 1), every child sees N CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=N) and trains under
keras.distribution.DataParallel over them, as kerascale.fit does; batches are
per replica, and the limit is the process's (all replicas share its memory).

For each model and precision, a fresh process runs `find_batch_size` under
`memory_limit` (compiles, seconds, the batch found); then real training
steps, each in a fresh process, bisect the truth: the largest batch whose
real step's peak resident memory (VmHWM, what a container's limit and the
OOM killer count) stays within the limit. The children are
tests_jax/memory_child.py, which the suite's test uses too (with a looser
bar, 0.75: the 0.9 goal is this benchmark's, and a run in the suite's
two-at-a-time lane once sat at 0.89).
Writes benchmarks/results/jax_batch_search.json (jax_batch_search_N.json
with --devices N).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

import _results  # benchmarks/_results.py

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHILD = ROOT / "tests_jax" / "memory_child.py"
SAMPLES = 16_384  # memory_child.py's data: no batch is larger


DEVICES = 1


def child(*args):
    flags = f"--xla_force_host_platform_device_count={DEVICES}" if DEVICES > 1 else ""
    out = subprocess.run(
        [sys.executable, str(CHILD), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "KERAS_BACKEND": "jax",
            "XLA_FLAGS": flags,
            # the devices stand in for GPUs: the search plans data-parallel
            "KERASCALE_CPU_DEVICES_STAND_IN": "1" if DEVICES > 1 else "",
        },
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def truth(model, policy, limit, start):
    """Bisection on real steps: (the largest batch within `limit`, steps)."""
    steps = 0

    def fits(batch):
        nonlocal steps
        steps += 1
        # Stopped once over the limit (its steps would tell nothing more).
        return child("step", model, policy, batch, limit)["peak"] <= limit

    low, high = start, None
    while not fits(low):
        low, high = low // 2, low
    while high is None:
        candidate = int(low * 1.25) + 1
        if candidate > SAMPLES:  # a larger batch is the whole data set
            return None, steps
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    while high - low > max(1, low // 100):  # to 1%
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low, steps


def main():
    parser = argparse.ArgumentParser()
    # 1 GiB: under 2 GiB the MLP's truth is past its 16,384 samples.
    parser.add_argument("--limit", default=str(1 << 30), help="bytes")
    parser.add_argument("--devices", type=int, default=1, help="CPU devices")
    args = parser.parse_args()
    limit = int(args.limit)
    global DEVICES
    DEVICES = args.devices
    rows = []
    for model in ("mlp", "cnn"):
        for policy in ("float32", "mixed_bfloat16"):
            found = child("search", model, policy, limit)
            real, steps = truth(model, policy, limit, found["batch"])
            row = {
                "model": model,
                "precision": policy,
                "replicas": DEVICES,
                "limit_bytes": limit,
                "found": found["batch"],
                "largest_fitting_by_xla": found["fits"],
                "compiles": found["compiles"],
                "compile_seconds": round(found["compile_seconds"], 2),
                "search_seconds": round(found["seconds"], 2),
                "truth": real,  # None: the whole data set fits
                "found_over_truth": round(found["batch"] / real, 3) if real else None,
                "truth_steps": steps,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    name = "jax_batch_search" + (f"_{DEVICES}" if DEVICES > 1 else "")
    _results.write(name, rows=rows)


if __name__ == "__main__":
    main()
