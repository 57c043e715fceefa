"""Keras's own tests of `fit`, with `model.fit` routed to `kerascale.fit`.

The keras wheel ships its test files (`keras/src/**/*_test.py`, identical to
the release tag). This runs the ones that train (the trainer, model,
functional, sequential and callback tests, and the TensorFlow distribute
tests) twice in child pytest runs: once as they are, once with every
`model.fit` routed to `kerascale.fit(model, ...)` (`upstream_route.py`). Of
the tests that call `fit` and pass plainly, it lists each one that fails
routed, with its error's first line, and writes JSON and a markdown table to
`benchmarks/results/`.

Run it on every change to the door or the model path (about 5 minutes on
2 cores):

    .venv/bin/python benchmarks/upstream_fit.py
    .venv/bin/python benchmarks/upstream_fit.py --options '{"precision": "float32"}'
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
FILES = (
    "trainers/trainer_test.py",
    "trainers/epoch_iterator_test.py",
    "models/model_test.py",
    "models/functional_test.py",
    "models/sequential_test.py",
    "callbacks/backup_and_restore_test.py",
    "callbacks/callback_test.py",
    "callbacks/csv_logger_test.py",
    "callbacks/early_stopping_test.py",
    "callbacks/lambda_callback_test.py",
    "callbacks/learning_rate_scheduler_test.py",
    "callbacks/model_checkpoint_test.py",
    "callbacks/monitor_callback_test.py",
    "callbacks/reduce_lr_on_plateau_test.py",
    "callbacks/swap_ema_weights_test.py",
    "callbacks/terminate_on_nan_test.py",
    "backend/tensorflow/distribute_test.py",
)


def _keras_src() -> pathlib.Path:
    import keras

    return pathlib.Path(keras.__file__).parent / "src"


def calls_fit(path: pathlib.Path) -> set[str]:
    """The test functions in `path` whose source calls `.fit(`."""
    import ast

    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            if ".fit(" in ast.get_source_segment(path.read_text(), node):
                out.add(node.name)
    return out


def run(files: list[pathlib.Path], routed: bool, options: str) -> dict[str, dict]:
    """{test id: {"outcome", "message", "seconds"}} from one child pytest."""
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.xml"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
        env["KERASCALE_CACHE_DIR"] = str(pathlib.Path(tmp) / "cache")
        env["KERASCALE_ROUTE_OPTIONS"] = options
        command = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--rootdir={tmp}", f"--junitxml={report}", "-o", "addopts=",
            "-W", "ignore::DeprecationWarning",
            *(["-p", "upstream_route"] if routed else []),
            *map(str, files),
        ]  # fmt: skip
        subprocess.run(command, env=env, cwd=tmp, capture_output=True, check=False)
        results = {}
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                element = case.find(tag)
                if element is not None:
                    outcome = "skipped" if tag == "skipped" else "failed"
                    message = (element.get("message") or "").strip().splitlines()
                    message = message[0][:300] if message else ""
                    break
            results[name] = {
                "outcome": outcome,
                "message": message,
                "seconds": float(case.get("time") or 0),
            }
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", default="{}", help="kerascale options, JSON")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    src = _keras_src()
    files = [src / f for f in FILES if (src / f).exists()]
    fitting = {f"{p.stem}::{name}" for p in files for name in calls_fit(p)}
    start = time.perf_counter()
    plain = run(files, False, args.options)
    routed = run(files, True, args.options)
    elapsed = time.perf_counter() - start

    def fits(test_id: str) -> bool:
        # classname "keras.src.trainers.trainer_test.TestTrainer"; a
        # parameterized test's name extends its function's name.
        parts = test_id.split("::")[0].split(".")
        module = next((p for p in parts if p.endswith("_test")), "")
        name = test_id.rsplit("::", 1)[-1]
        return any(
            f == f"{module}::{name}" or f"{module}::{name}".startswith(f + "_")
            for f in fitting
        )

    base = [t for t, r in plain.items() if r["outcome"] == "passed" and fits(t)]
    failing = {t: routed.get(t, {"message": "not run"}) for t in base
               if routed.get(t, {}).get("outcome") != "passed"}  # fmt: skip
    both = [t for t in base if t not in failing]
    summary = {
        "options": json.loads(args.options),
        "fit_tests_passing_plainly": len(base),
        "passing_routed": len(both),
        "seconds_plain": round(sum(plain[t]["seconds"] for t in both), 1),
        "seconds_routed": round(sum(routed[t]["seconds"] for t in both), 1),
        "wall_seconds": round(elapsed, 1),
        "failing": {t: r["message"] for t, r in sorted(failing.items())},
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream_fit.json").write_text(json.dumps(summary, indent=2))
    lines = [
        f"Keras's fit tests through kerascale.fit (options {args.options}): "
        f"{len(both)} of {len(base)} pass; time over those "
        f"{summary['seconds_routed']} s routed vs {summary['seconds_plain']} s plain",
        "",
        "| test | error through kerascale.fit |",
        "|---|---|",
        *(f"| `{t}` | {m.replace('|', '/')} |" for t, m in summary["failing"].items()),
    ]
    (out / "upstream_fit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
