"""Keras's own tests of `fit`, with `model.fit` routed to `kerascale.fit`.

The keras wheel ships its test files (`keras/src/**/*_test.py`, identical to
the release tag). This runs the ones that train (the trainer, model,
functional, sequential and callback tests, and the TensorFlow distribute
tests) twice in child pytest runs: once as they are, once with every
`model.fit` routed to `kerascale.fit(model, ...)` (`upstream_route.py`). Of
the tests that call `fit` and pass plainly, it lists each one that fails
routed, with its error's first line, and writes JSON and a markdown table to
`benchmarks/results/`.

Run it on every change to the door or the model path (about 10 minutes on
2 cores; Keras's trainer_test.py imports jax, hence the `upstream` extra):

    .venv/bin/pip install -e ".[test,upstream]"
    .venv/bin/python benchmarks/upstream_fit.py
    .venv/bin/python benchmarks/upstream_fit.py --options '{"precision": "float32"}'

On a Keras whose wheel ships no tests (keras-nightly), run a release's test
files on it: `--tests-from .venv/lib/python3.11/site-packages/keras/src`
with keras-nightly first on PYTHONPATH (README's keras-nightly lane).
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
)
# Each backend's own trainer and distribution tests; on JAX also the
# optimizer tests that train through fit (gradient accumulation).
BACKEND_FILES = {
    "tensorflow": ("backend/tensorflow/distribute_test.py",),
    "jax": (
        "backend/jax/trainer_test.py",
        "backend/jax/distribution_lib_test.py",
        "distribution/distribution_lib_test.py",
        "optimizers/optimizer_test.py",
        "optimizers/adam_test.py",
        "optimizers/lion_test.py",
        "optimizers/multi_optimizer_test.py",
        "optimizers/muon_test.py",
        "optimizers/schedule_free_adamw_test.py",
        "optimizers/loss_scale_optimizer_test.py",
    ),
}


def _keras_src() -> pathlib.Path:
    import keras

    return pathlib.Path(keras.__file__).parent / "src"


def run(
    files: list[pathlib.Path], routed: bool, options: str, env: dict[str, str]
) -> dict[str, dict]:
    """{"file_test::Class::test": {"outcome", "message", "seconds", "fit"}},
    one child pytest per file (a crash costs one file, and names are clear);
    "fit": whether the test called `fit`."""
    results = {}
    for path in files:
        for name, r in _run_file(path, routed, options, env).items():
            results[f"{path.stem}::{name}"] = r
    return results


def _run_file(
    path: pathlib.Path,
    routed: bool,
    options: str,
    backend_env: dict[str, str],
    extra: tuple[str, ...] = (),
    timeout: float | None = None,
) -> dict[str, dict]:
    """One child pytest of the file `path` (`extra`: more pytest arguments;
    `timeout`: its seconds, after which the tests it had not reported are
    missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.xml"
        log = pathlib.Path(tmp) / "called.json"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **backend_env)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
        env["KERASCALE_CACHE_DIR"] = str(pathlib.Path(tmp) / "cache")
        env["KERASCALE_ROUTE_OPTIONS"] = options
        env["KERASCALE_ROUTE"] = "1" if routed else "0"
        env["KERASCALE_ROUTE_LOG"] = str(log)
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={tmp}",
            f"--junitxml={report}",
            "-o",
            "addopts=",
            "-W",
            "ignore::DeprecationWarning",
            "-p",
            "upstream_route",
            *extra,
            str(path),
        ]
        try:
            subprocess.run(
                command,
                env=env,
                cwd=tmp,
                capture_output=True,
                check=False,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {}
        if not report.exists():
            return {}
        # node ids "path::Class::test[params]" -> "Class::test[params]"
        ids = json.loads(log.read_text()) if log.exists() else []
        called = {"::".join(n.split("::")[1:]) for n in ids}
        results = {}
        for case in ET.parse(report).iter("testcase"):
            cls = (case.get("classname") or "").rsplit(".", 1)[-1]
            module_level = not cls or cls.endswith("_test")
            name = case.get("name") if module_level else f"{cls}::{case.get('name')}"
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
                "fit": name in called,
            }
        return results


def _copied_out(files: list[pathlib.Path]) -> list[pathlib.Path]:
    """Another wheel's test files, each in a folder of its own with no
    package above it: pytest then imports it as a top-level module, and its
    `import keras` finds the Keras under test, not the wheel's beside it."""
    import shutil

    out = pathlib.Path(tempfile.mkdtemp(prefix="kerascale-upstream-"))
    copied = []
    for i, path in enumerate(files):
        folder = out / str(i)
        folder.mkdir()
        copied.append(pathlib.Path(shutil.copy(path, folder / path.name)))
    return copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", default="{}", help="kerascale options, JSON")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--backend", choices=sorted(BACKEND_FILES), default="tensorflow"
    )
    parser.add_argument(
        "--devices", type=int, default=1, help="JAX: forced host devices"
    )
    parser.add_argument(
        "--as-cpu",
        action="store_true",
        help="JAX: leave the forced devices CPU devices (kerascale then trains "
        "on one, as plain fit does); without it they stand in for GPUs, and "
        "kerascale trains data-parallel where plain fit uses one device",
    )
    parser.add_argument("--only", action="append", help="a file under keras/src")
    parser.add_argument(
        "--tests-from",
        help="keras/src of another Keras wheel whose test files to run (a "
        "nightly ships none: run a release's on it, issue 56)",
    )
    args = parser.parse_args()
    src = pathlib.Path(args.tests_from) if args.tests_from else _keras_src()
    names = args.only or [*FILES, *BACKEND_FILES[args.backend]]
    files = [src / f for f in names if (src / f).exists()]
    if args.tests_from:
        files = _copied_out(files)
    env = {"KERAS_BACKEND": args.backend}
    if args.backend == "jax":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
        if args.devices > 1 and not args.as_cpu:
            env["KERASCALE_CPU_DEVICES_STAND_IN"] = "1"
    start = time.perf_counter()
    plain = run(files, False, args.options, env)
    routed = run(files, True, args.options, env)
    elapsed = time.perf_counter() - start
    # The tests that call fit (seen at run time) and pass plainly.
    base = [t for t, r in plain.items() if r["outcome"] == "passed" and r["fit"]]
    failing = {
        t: routed.get(t, {"message": "not run"})
        for t in base
        if routed.get(t, {}).get("outcome") != "passed"
    }
    both = [t for t in base if t not in failing]
    summary = {
        "backend": args.backend,
        "devices": args.devices,
        "as_cpu": args.as_cpu,
        "options": json.loads(args.options),
        "fit_tests_passing_plainly": len(base),
        "passing_routed": len(both),
        "seconds_plain": round(sum(plain[t]["seconds"] for t in both), 1),
        "seconds_routed": round(sum(routed[t]["seconds"] for t in both), 1),
        "wall_seconds": round(elapsed, 1),
        "failing": {t: r["message"] for t, r in sorted(failing.items())},
        # Where the added time goes: the 15 tests kerascale slows most.
        "most_added_seconds": dict(
            sorted(
                (
                    (t, round(routed[t]["seconds"] - plain[t]["seconds"], 2))
                    for t in both
                ),
                key=lambda item: -item[1],
            )[:15]
        ),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"upstream_fit_{args.backend}_{args.devices}dev" + (
        "_as_cpu" if args.as_cpu else ""
    )
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=2))
    lines = [
        f"Keras's fit tests through kerascale.fit on {args.backend}, "
        f"{args.devices} device(s){' (CPU devices)' if args.as_cpu else ''} "
        f"(options {args.options}): "
        f"{len(both)} of {len(base)} pass; time over those "
        f"{summary['seconds_routed']} s routed vs {summary['seconds_plain']} s plain",
        "",
        "| test | error through kerascale.fit |",
        "|---|---|",
        *(f"| `{t}` | {m.replace('|', '/')} |" for t, m in summary["failing"].items()),
    ]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
