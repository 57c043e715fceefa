"""Multi-worker training on 127.0.0.1: agreement and time to notice a dead worker.

    python benchmarks/multiworker.py [--rounds 3] [--out benchmarks/results]

Runs the 2-worker cluster of tests/multiworker_child.py:
- "fit": `kerascale.fit` on 2 workers and in one process; the largest weight
  difference between the workers and against the one process.
- "long" with one worker killed (SIGKILL) or frozen (SIGSTOP: its sockets stay
  open, as with a lost machine or a cut network) after epoch 1: seconds until
  the other exits, for several `worker_timeout` values, and its exit code.
- decisions agreed at one step (kerascale.apply.step_agreement): the median step
  time with no agreement, with one that no flag raises, and with a time-based
  save every second (and each proposal's round trip), alternating the three
  for --rounds rounds; and the time from SIGTERM to one worker until both
  have exited 143.
Writes multiworker.json and multiworker.md.
"""

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
from test_multiworker import (  # noqa: E402
    Lines,
    free_ports,
    load,
    lose_a_worker,
    max_diff,
    run_cluster,
    run_single,
    start,
)


def agreement() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        started = time.perf_counter()
        run_cluster("fit", out)
        cluster_s = time.perf_counter() - started
        run_single("fit", out)
        names = ("w0", "w1", "single")
        (w0, r0), (w1, _), (ws, rs) = (load(out, "fit", n) for n in names)
        return {
            "workers_max_diff": max_diff(w0, w1),
            "vs_single_max_diff": max_diff(w0, ws),
            "loss_max_diff": float(
                np.max(np.abs(np.array(r0["history"]["loss"]) - rs["history"]["loss"]))
            ),
            "cluster_seconds": round(cluster_s, 1),
        }


def detection(sig: int, worker_timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        took, returncode, err = lose_a_worker(Path(tmp), sig, worker_timeout, wait=600)
    return {
        "seconds": round(took, 1),
        "exit_code": returncode,
        "worker_lost_error": "WorkerLostError" in err,
    }


def decision_cost(rounds: int) -> dict:
    """Median step time (ms) per variant, the variants alternating."""
    times: dict[str, list[float]] = {"off": [], "idle": [], "saving": []}
    round_ms: list[float] = []
    for _ in range(rounds):
        for variant in times:
            with tempfile.TemporaryDirectory() as tmp:
                out, mode = Path(tmp), f"steptime-{variant}"
                run_cluster(mode, out)
                _, r0 = load(out, mode, "w0")
                _, r1 = load(out, mode, "w1")
            times[variant].append(max(r0["step_ms"], r1["step_ms"]))
            round_ms += r0["round_ms"] + r1["round_ms"]
    medians = {k: round(statistics.median(v), 3) for k, v in times.items()}
    return {
        "step_ms": medians,
        "idle_vs_off": round(medians["idle"] / medians["off"], 3),
        "saving_vs_off": round(medians["saving"] / medians["off"], 3),
        "proposal_round_trip_ms": round(statistics.median(round_ms), 2)
        if round_ms
        else None,
        "proposals": len(round_ms),
        "runs": times,
    }


def preemption() -> dict:
    """Seconds from SIGTERM to worker 1 until both workers have exited."""
    with tempfile.TemporaryDirectory() as tmp:
        ports = free_ports()
        workers = [start("long", i, ports, tmp, "20") for i in range(2)]
        try:
            Lines(workers[0]).wait_for("epoch 1 ", timeout=180)
            os.kill(workers[1].pid, signal.SIGTERM)
            sent = time.monotonic()
            codes = [w.wait(timeout=300) for w in workers]
            took = time.monotonic() - sent
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                w.wait()
    return {"seconds": round(took, 2), "exit_codes": codes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--only-decisions",
        action="store_true",
        help="measure only the agreed decisions (skips the slow detection runs)",
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    results = {"agreement": agreement(), "detection": []}
    print(json.dumps(results["agreement"]), flush=True)
    results["decisions"] = decision_cost(args.rounds)
    print(json.dumps(results["decisions"]), flush=True)
    results["preemption"] = [preemption() for _ in range(args.rounds)]
    print(json.dumps(results["preemption"]), flush=True)
    for name, sig in (("SIGKILL", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
        for worker_timeout in () if args.only_decisions else (5, 20, 60):
            runs = [detection(sig, worker_timeout) for _ in range(args.rounds)]
            row = {
                "signal": name,
                "worker_timeout": worker_timeout,
                "median_seconds": statistics.median(r["seconds"] for r in runs),
                "max_seconds": max(r["seconds"] for r in runs),
                "all_exit_nonzero": all(r["exit_code"] != 0 for r in runs),
                "all_worker_lost_error": all(r["worker_lost_error"] for r in runs),
                "runs": runs,
            }
            results["detection"].append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "multiworker.json"), "w") as f:
        json.dump(results, f, indent=2)
    a = results["agreement"]
    lines = [
        "## Multi-worker (2 workers on 127.0.0.1)",
        "",
        f"- weights, worker 0 vs worker 1: max difference {a['workers_max_diff']:.1e}",
        f"- weights, cluster vs one process: max difference "
        f"{a['vs_single_max_diff']:.1e} (loss {a['loss_max_diff']:.1e})",
        "",
        "Decisions agreed at one step (median step time, ms, of 250 steps, "
        f"{args.rounds} alternating rounds):",
        "",
        f"- no agreement {results['decisions']['step_ms']['off']}, agreement with no "
        f"flag {results['decisions']['step_ms']['idle']} "
        f"({results['decisions']['idle_vs_off']}x), a time-based save every second "
        f"{results['decisions']['step_ms']['saving']} "
        f"({results['decisions']['saving_vs_off']}x, saves included)",
        f"- one proposal's round trip (propose, every worker acknowledges): "
        f"{results['decisions']['proposal_round_trip_ms']} ms median of "
        f"{results['decisions']['proposals']}",
        "- SIGTERM to worker 1 until both exited: "
        + ", ".join(
            f"{p['seconds']} s (codes {p['exit_codes']})" for p in results["preemption"]
        ),
    ]
    if results["detection"]:
        lines += [
            "",
            "| worker lost by | worker_timeout (s) | survivor exits after (s), "
            "median / max | exit non-zero | WorkerLostError |",
            "|---|---|---|---|---|",
        ]
    for r in results["detection"]:
        lines.append(
            f"| {r['signal']} | {r['worker_timeout']} | {r['median_seconds']} / "
            f"{r['max_seconds']} | {r['all_exit_nonzero']} | "
            f"{r['all_worker_lost_error']} |"
        )
    with open(os.path.join(args.out, "multiworker.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
