"""Recomputation (kerascale.apply.remat) under a real memory limit, on both
backends: how much larger a batch fits, and what each sample then costs.

    .venv/bin/python benchmarks/remat.py [--budget BYTES] [--backends tensorflow,jax]

For each backend (TensorFlow from .venv, JAX from .venv-jax), the limit is
the resident memory of a step at batch 8 plus BUDGET (512 MiB by default):
the activations' room. Real steps in fresh processes (benchmarks/
remat_child.py: a deep gelu MLP, Adam) bisect the largest batch whose peak
resident memory stays within it, without recomputation and with it;
then each batch found is timed, and the batch without recomputation is
timed with it too (the recomputation's cost at one batch). Then
`kerascale.plan` is asked, under the same limit, for a batch that fits in
one pass only with recomputation (the bound with it, less 5%, a multiple of
64), and its decision is recorded: recomputation, or accumulation alone,
weighed by measured throughput. Writes benchmarks/results/remat.json.
"""

import argparse
import json
import os
import pathlib
import subprocess

import _results  # benchmarks/_results.py

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHILD = ROOT / "benchmarks" / "remat_child.py"
PYTHONS = {
    "tensorflow": ROOT / ".venv/bin/python",
    "jax": ROOT / ".venv-jax/bin/python",
}


def child(backend, mode, batch, *more):
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "XLA_FLAGS": "",
    }
    out = subprocess.run(
        [str(PYTHONS[backend]), str(CHILD), mode, str(batch), *map(str, more)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def largest(backend, mode, limit, start=64):
    """The largest batch whose real step stays within `limit`, to 2%."""
    low, high = 0, None
    batch = start
    while high is None:
        if child(backend, mode, batch)["peak"] <= limit:
            low, batch = batch, batch * 2
        else:
            high = batch
            if low == 0:
                raise SystemExit(f"{backend} {mode}: batch {batch} over the limit")
    while high - low > max(1, low // 50):
        mid = (low + high) // 2
        if child(backend, mode, mid)["peak"] <= limit:
            low = mid
        else:
            high = mid
    return low


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=int, default=512 << 20)
    parser.add_argument("--backends", default="tensorflow,jax")
    args = parser.parse_args()
    rows, plans = [], []
    for backend in args.backends.split(","):
        if not PYTHONS[backend].exists():
            print(f"{backend}: no {PYTHONS[backend]}, skipped")
            continue
        limit = child(backend, "none", 8)["peak"] + args.budget
        plain = largest(backend, "none", limit)
        bound = None
        for mode in ("none", "activations"):
            batch = plain if mode == "none" else largest(backend, mode, limit)
            at_own = child(backend, mode, batch)
            at_plain = child(backend, mode, plain)
            row = {
                "backend": backend,
                "mode": mode,
                "limit_bytes": limit,
                "largest_batch": batch,
                "batch_ratio": round(batch / plain, 3),
                "ms_per_sample": round(1e3 * at_own["step_seconds"] / batch, 4),
                "ms_per_sample_at_plain_batch": round(
                    1e3 * at_plain["step_seconds"] / plain, 4
                ),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            bound = batch
        asked = int(bound * 0.95) // 64 * 64
        decided = {"backend": backend, **child(backend, "plan", asked, limit)}
        plans.append(decided)
        print(json.dumps(decided), flush=True)
    _results.write("remat", rows=rows, plans=plans)


if __name__ == "__main__":
    main()
