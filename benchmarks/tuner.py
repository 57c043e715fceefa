"""Trials wasted on batches that do not fit: keras-tuner alone vs kerascale.tuner.

    python benchmarks/tuner.py [--trials 8] [--memory-limit 1.2GiB]

The search of examples/tune_batch_size.py (width 256 or 2048, batch 32 to
16384, two precisions; RandomSearch, seed 0), run twice under the same memory
limit (RLIMIT_DATA on CPU, as kerascale's probes have):
- keras-tuner alone, in a child process under the limit: the usual
  `HyperModel.fit` override with `hp.Int("batch_size", ...)`. A batch that
  does not fit kills the process (on CPU TensorFlow aborts; on a GPU it is a
  failed trial, and three in a row stop the search).
- `kerascale.tuner.ScaledHyperModel`: the range lowered to the measured bound,
  infeasible trials recorded without training.
Writes tuner.json and tuner.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PLAIN = r"""
import json, os, resource, sys
limit, directory, trials = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, sys.argv[4])
import keras, keras_tuner
from tune_batch_size import build_model, synthetic_data

class Plain(keras_tuner.HyperModel):
    def build(self, hp):
        hp.Choice("precision", ["float32", "mixed_bfloat16"])
        hp.Choice("lr_scaling", ["none", "sqrt"])
        return build_model(hp)
    def fit(self, hp, model, *args, **kwargs):
        batch = hp.Int("batch_size", 32, 16384, step=2, sampling="log")
        print("trial batch", batch, hp.values.get("width"), flush=True)
        return model.fit(*args, batch_size=batch, **kwargs)

x, y = synthetic_data()
tuner = keras_tuner.RandomSearch(Plain(), objective="val_accuracy",
    max_trials=trials, directory=directory, project_name="plain",
    overwrite=True, seed=0)
tuner.search(x, y, epochs=2, validation_split=0.2, verbose=0)
print("search finished", flush=True)
"""


def plain(trials: int, limit: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                PLAIN,
                str(limit),
                tmp,
                str(trials),
                str(ROOT / "examples"),
            ],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        seconds = time.perf_counter() - started
        tried = [
            line.split()[2:4]
            for line in proc.stdout.splitlines()
            if line.startswith("trial batch")
        ]
        project = Path(tmp) / "plain"
        statuses = []
        for trial_dir in sorted(project.glob("trial_*")):
            saved = json.loads((trial_dir / "trial.json").read_text())
            statuses.append(saved["status"])
    return {
        "exit_code": proc.returncode,
        "finished": "search finished" in proc.stdout,
        "trials_started": len(tried),
        "batches_started": [int(b) for b, _ in tried],
        "trials_completed": statuses.count("COMPLETED"),
        "trials_failed": statuses.count("FAILED") + statuses.count("INVALID"),
        "seconds": round(seconds, 1),
    }


def scaled(trials: int, memory_limit: str) -> dict:
    sys.path.insert(0, str(ROOT / "examples"))
    import keras_tuner
    from tune_batch_size import make_hypermodel, synthetic_data

    from kerascale.tuner import INFEASIBLE

    x, y = synthetic_data()
    hypermodel = make_hypermodel(memory_limit)
    with tempfile.TemporaryDirectory() as tmp:
        tuner = keras_tuner.RandomSearch(
            hypermodel,
            objective="val_accuracy",
            max_trials=trials,
            directory=tmp,
            project_name="scaled",
            overwrite=True,
            seed=0,
        )
        started = time.perf_counter()
        tuner.search(x, y, epochs=2, validation_split=0.2, verbose=0)
        seconds = time.perf_counter() - started
        rows = [
            (t.hyperparameters.values, t.metrics.exists(INFEASIBLE), t.status)
            for t in tuner.oracle.trials.values()
        ]
    return {
        "finished": True,
        "trials": len(rows),
        "trials_completed": sum(s == "COMPLETED" for _, _, s in rows),
        "trials_infeasible": sum(i for _, i, _ in rows),
        "batches": [v["batch_size"] for v, _, _ in rows],
        "bounds": sorted(set(hypermodel.bounds.values())),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--memory-limit", default="1.2GiB")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kerascale._units import parse_bytes

    limit = parse_bytes("memory_limit", args.memory_limit)
    results = {
        "memory_limit": args.memory_limit,
        "trials": args.trials,
        "keras_tuner_alone": plain(args.trials, limit),
        "kerascale": scaled(args.trials, args.memory_limit),
    }
    print(json.dumps(results, indent=2))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tuner.json"), "w") as f:
        json.dump(results, f, indent=2)
    p, k = results["keras_tuner_alone"], results["kerascale"]
    lost = p["batches_started"][p["trials_completed"] :]
    lines = [
        f"## keras-tuner batch search ({args.trials} trials, {args.memory_limit})",
        "",
        "| | finished | trials run to the end | trials lost to memory | seconds |",
        "|---|---|---|---|---|",
        f"| keras-tuner alone | {p['finished']} (exit {p['exit_code']}) | "
        f"{p['trials_completed']} | {p['trials_started'] - p['trials_completed']}"
        f" (batches {lost}) | {p['seconds']} |",
        f"| kerascale.tuner | {k['finished']} | "
        f"{k['trials_completed'] - k['trials_infeasible']} | {k['trials_infeasible']}"
        f" infeasible, not trained (bounds {k['bounds']}) | {k['seconds']} |",
    ]
    with open(os.path.join(args.out, "tuner.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
