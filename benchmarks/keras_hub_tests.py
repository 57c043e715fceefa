"""keras-hub's task tests with `model.fit` routed to `kerascale.fit`: what a
real model library's short fits cost through kerascale (issue 79).

Each task test (`run_task_test`: a tiny model fitted three or four times
for a few steps) runs twice in child pytest runs, plainly and with every
`fit` routed (`upstream_route.py`), file by file, the two runs of a file
back to back and in alternating order (a busy machine slows both). Of the
tests that call `fit` and pass plainly, it compares each test's time
(pytest's, imports apart) and lists those that fail routed.

The test files are keras-hub's own, from a checkout of its repository
(`--repo`), run against the keras-hub installed (the wheel ships no test
data: the checkout's `keras_hub/src/tests/test_data` stands in,
`keras_hub_data.py`):

    .venv/bin/python benchmarks/keras_hub_tests.py --repo PATH
    .venv/bin/python benchmarks/keras_hub_tests.py --repo PATH --backend jax
    .venv/bin/python benchmarks/keras_hub_tests.py --repo PATH --only gpt2

Issue 79's bars: over the tests that pass both ways, at most 1.15x plain
`fit`'s time on each backend, and no test over 1.15x its own plain time
plus 2 s. Writes benchmarks/results/keras_hub_tests_<backend>.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from upstream_fit import _run_file  # noqa: E402

# A test over this is its own bar: 1.15x its plain time plus 2 s.
RATIO, SLACK = 1.15, 2.0


def task_test_files(repo: pathlib.Path, only: list[str] | None) -> list[pathlib.Path]:
    """The test files under keras_hub/src/models that call `run_task_test`
    (each fits its task), those whose path holds an `--only` word if any."""
    found = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "grep",
            "-l",
            "run_task_test",
            "--",
            "keras_hub/src/models",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not found:  # not a git checkout: walk it
        found = [
            str(p.relative_to(repo))
            for p in (repo / "keras_hub/src/models").rglob("*_test.py")
            if "run_task_test" in p.read_text()
        ]
    files = sorted(repo / f for f in found if f.endswith("_test.py"))
    if only:
        files = [f for f in files if any(word in str(f) for word in only)]
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a keras-hub checkout")
    parser.add_argument(
        "--backend", choices=("tensorflow", "jax"), default="tensorflow"
    )
    parser.add_argument("--only", action="append", help="a word of the files' paths")
    parser.add_argument("--options", default="{}", help="kerascale options, JSON")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a file")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    repo = pathlib.Path(args.repo).resolve()
    files = task_test_files(repo, args.only)
    if not files:
        sys.exit(f"no task test files under {repo}/keras_hub/src/models")
    env = {
        "KERAS_BACKEND": args.backend,
        "KERASCALE_KERAS_HUB_DATA": str(repo / "keras_hub/src/tests/test_data"),
    }
    # Only the tests that fit (run_task_test's are named *_basics).
    extra = ("-p", "keras_hub_data", "-k", "basics")
    plain: dict[str, dict] = {}
    routed: dict[str, dict] = {}
    start = time.perf_counter()
    for i, path in enumerate(files):
        order = (False, True) if i % 2 == 0 else (True, False)
        for is_routed in order:
            found = _run_file(path, is_routed, args.options, env, extra, args.timeout)
            into = routed if is_routed else plain
            for name, r in found.items():
                into[f"{path.stem}::{name}"] = r
        print(f"{i + 1}/{len(files)} {path.stem}", flush=True)
    elapsed = time.perf_counter() - start
    base = [t for t, r in plain.items() if r["outcome"] == "passed" and r["fit"]]
    failing = {
        t: routed.get(t, {"message": "not run (killed at the timeout?)"})["message"]
        for t in base
        if routed.get(t, {}).get("outcome") != "passed"
    }
    both = [t for t in base if t not in failing]
    seconds_plain = sum(plain[t]["seconds"] for t in both)
    seconds_routed = sum(routed[t]["seconds"] for t in both)
    over = {
        t: (round(plain[t]["seconds"], 2), round(routed[t]["seconds"], 2))
        for t in both
        if routed[t]["seconds"] > RATIO * plain[t]["seconds"] + SLACK
    }
    summary = {
        "backend": args.backend,
        "files": len(files),
        "fit_tests_passing_plainly": len(base),
        "passing_routed": len(both),
        "seconds_plain": round(seconds_plain, 1),
        "seconds_routed": round(seconds_routed, 1),
        "ratio": round(seconds_routed / seconds_plain, 3) if seconds_plain else None,
        "over_their_own_bar": over,
        "wall_seconds": round(elapsed, 1),
        "failing": dict(sorted(failing.items())),
        "per_test": {
            t: (round(plain[t]["seconds"], 2), round(routed[t]["seconds"], 2))
            for t in both
        },
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"keras_hub_tests_{args.backend}.json").write_text(
        json.dumps(summary, indent=2)
    )
    print(
        f"\nkeras-hub task tests on {args.backend}: {len(both)} of {len(base)} "
        f"that fit and pass plainly pass through kerascale.fit; their time "
        f"{seconds_routed:.1f} s routed against {seconds_plain:.1f} s plain "
        f"({summary['ratio']}x); over {RATIO}x their own plus {SLACK:.0f} s: "
        f"{len(over)}"
    )
    for t, (p, r) in over.items():
        print(f"  {t}: {p} s plain, {r} s routed")
    for t, m in summary["failing"].items():
        print(f"  fails routed: {t}: {m}")


if __name__ == "__main__":
    main()
