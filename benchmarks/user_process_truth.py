"""The batch search against the truth where `fit` trains (issue 38).

    python benchmarks/user_process_truth.py [--limit 2GiB]
        [--backends tensorflow,jax] [--models mlp,cnn]
        [--precisions float32,mixed_bfloat16] [--epochs E]

For each backend, model and precision, a user's script
(`user_process_child.py`) holds its data as arrays, calls
`kerascale.find_batch_size(model, x, y, memory_limit=LIMIT)` and trains
Keras's own `fit` at the answer in the same process, reporting its peak
resident memory (what a container counts). The truth is found by bisection
with fresh runs of the same script that train at a batch with no limit and
report their peak: the largest batch whose peak stays under the limit in
each of REPEATS runs. Beside
it, the fresh-process truth the search answered for before (a process that
holds one batch and nothing else). TensorFlow runs in `.venv`, JAX in
`.venv-jax` (README's environments). With --epochs E, the answer and the
user's-process truth train E whole epochs, as a user's run does (its peak
grows over the epochs), instead of 2 steps. Writes
`benchmarks/results/user_process_truth.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("user_process_child.py")
PYTHON = {"tensorflow": ROOT / ".venv/bin/python", "jax": ROOT / ".venv-jax/bin/python"}


EPOCHS = 0  # --epochs: whole epochs in the "fit" and "search-then-fit" runs


def run(backend: str, *args: object) -> dict:
    if EPOCHS and args[0] != "fresh":
        args = (*args, EPOCHS)
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [str(PYTHON[backend]), str(CHILD), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        return {"peak": None, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# The largest batch the truth looks for: the "fit" runs hold this many
# samples at most (a larger batch is the whole data set again, and its peak
# stays flat, so an expansion past it would never stop).
CAP = {"mlp": 16384, "cnn": 4096}
REPEATS = 2  # a batch fits where it fits in every run


def truth(backend: str, mode: str, model: str, policy: str, limit: int, near: int):
    """The largest batch whose `mode` run peaks under `limit`, by bisection
    from `near`, at most `CAP[model]` (where that fits: the whole data set);
    (it, runs)."""
    runs = 0
    cap = CAP[model]

    def fits(batch: int) -> bool:
        # In every one of REPEATS runs: one run's peak moves 20-40 MB between
        # identical runs (an MLP at 4615 peaked 1206.9 MB, then 1248.8), and
        # a bisection on single runs keeps the lucky ones.
        nonlocal runs
        for _ in range(REPEATS):
            runs += 1
            peak = run(backend, mode, model, policy, batch).get("peak")
            if peak is None or peak > limit:
                return False
        return True

    low, high = min(cap, max(1, near)), None
    while not fits(low):
        high, low = low, max(1, low // 2)
        if low == 1 and not fits(1):
            return 0, runs
    step = max(1, low // 4)
    while high is None:
        if low >= cap:
            return cap, runs
        if fits(min(cap, low + step)):
            low, step = min(cap, low + step), step * 2
        else:
            high = min(cap, low + step)
    while high - low > max(1, low // 50):
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low, runs


def main() -> None:
    from kerascale._units import format_bytes, parse_bytes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", default="2GiB")
    p.add_argument("--backends", default="tensorflow,jax")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--epochs", type=int, default=0, help="0: 2 steps")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()
    global EPOCHS
    EPOCHS = args.epochs
    name = "user_process_truth" + (f"_{EPOCHS}_epochs" if EPOCHS else "")
    limit = parse_bytes("limit", args.limit)
    rows = []
    for backend in args.backends.split(","):
        for model in args.models.split(","):
            for policy in args.precisions.split(","):
                started = time.perf_counter()
                found = run(backend, "search-then-fit", model, policy, limit)
                answer = found.get("answer") or found.get("batch") or 1
                user, user_runs = truth(backend, "fit", model, policy, limit, answer)
                fresh, fresh_runs = truth(
                    backend, "fresh", model, policy, limit, user or answer
                )
                row = {
                    "backend": backend,
                    "model": model,
                    "precision": policy,
                    "answer": found.get("answer"),
                    "peak_at_answer": found.get("peak"),
                    "fits": found.get("peak") is not None and found["peak"] <= limit,
                    "truth_user_process": user,
                    "truth_fresh_process": fresh,
                    "answer_vs_user_truth": round(answer / user, 3) if user else None,
                    "search_seconds": found.get("seconds"),
                    "truth_runs": user_runs + fresh_runs,
                    "seconds": round(time.perf_counter() - started, 1),
                    "error": found.get("error"),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2))
    lines = [
        f"Batch search vs the truth where fit trains, limit {args.limit}, "
        f"{f'{EPOCHS} epochs' if EPOCHS else '2 steps'} ({time.strftime('%Y-%m-%d')})",
        "",
        "| backend | model | precision | answer | peak at answer (user's "
        "process) | truth, user's process | answer / truth | truth, fresh "
        "process | search s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = format_bytes(r["peak_at_answer"]) if r["peak_at_answer"] else "-"
        lines.append(
            f"| {r['backend']} | {r['model']} | {r['precision']} | {r['answer']} | "
            f"{peak}{'' if r['fits'] else ' (OVER)'} | {r['truth_user_process']} | "
            f"{r['answer_vs_user_truth']} | {r['truth_fresh_process']} | "
            f"{r['search_seconds']} |"
        )
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
