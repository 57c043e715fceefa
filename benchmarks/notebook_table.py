"""Issue 78's notebook table, rerun in Jupyter kernels (nbclient), as a data
scientist runs it: 20,000 x 32 synthetic features, 10 classes, a 128-128-10
MLP with Adam, `validation_split=0.2`, `EarlyStopping(monitor="val_loss",
patience=3, restore_best_weights=True)`, 20 epochs, Keras's progress bars.

    python3 -m venv /tmp/nbenv && /tmp/nbenv/bin/pip install -e ".[tensorflow]" \\
        nbclient nbformat ipykernel
    /tmp/nbenv/bin/python benchmarks/notebook_table.py [--seeds 3] [--backend jax]

Each seed is one notebook in a fresh kernel: a cell makes the data (the
`tabular` task of benchmarks/time_to_accuracy.py), then plain `model.fit` and
`kerascale.fit` with the same call, each in its cell, from a fresh kerascale
cache (its planning in the time); their order alternates with the seed. A cell
reports the wall time, the epochs and updates `EarlyStopping` let run, and the
accuracy on 4,000 held-out samples. Prints the table with the medians and
writes `benchmarks/results/notebook_table_<backend>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import write  # noqa: E402

SETUP = """
import json, os, sys, tempfile, time
os.environ["KERAS_BACKEND"] = {backend!r}
os.environ["KERASCALE_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, {benchmarks!r})
import keras, kerascale
from time_to_accuracy import tabular
build, (x, y), (x_test, y_test) = tabular({seed})


class Updates(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.n = 0
    def on_train_batch_end(self, batch, logs=None):
        self.n += 1


def row(name, fit):
    keras.utils.set_random_seed({seed})
    start = time.perf_counter()
    model = build()
    stop = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=3, restore_best_weights=True
    )
    history = fit(model, x, y, validation_split=0.2, epochs=20, callbacks=[stop])
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    batches = history.history.get("batch_size") or [32] * len(history.epoch)
    samples = 16_000
    updates = sum(-(-samples // int(b)) for b in batches)
    return {{
        "name": name, "seconds": seconds, "accuracy": float(accuracy),
        "epochs": len(history.epoch), "updates": updates,
        "batches": sorted(set(int(b) for b in batches)),
    }}
"""
PLAIN = 'print("ROW", json.dumps(row("plain", lambda m, *a, **k: m.fit(*a, **k))))'
KERASCALE = 'print("ROW", json.dumps(row("kerascale", kerascale.fit)))'


def notebook(seed: int, backend: str) -> list[dict]:
    import nbformat
    from nbclient import NotebookClient

    cells = [SETUP.format(backend=backend, benchmarks=str(HERE), seed=seed)]
    cells += [PLAIN, KERASCALE] if seed % 2 == 0 else [KERASCALE, PLAIN]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    os.environ.update(env)
    NotebookClient(nb, timeout=900, kernel_name="python3").execute()
    rows = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                if line.startswith("ROW "):
                    rows.append(json.loads(line[4:]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--backend", default="tensorflow")
    args = parser.parse_args()
    runs = {"plain": [], "kerascale": []}
    for seed in range(args.seeds):
        for r in notebook(seed, args.backend):
            runs[r["name"]].append(r)
            print(f"seed {seed}: {r}", flush=True)
    head = "batch | updates | epochs | wall time | test accuracy"
    print(f"\n| {args.backend} | {head} |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for name, rs in runs.items():
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in ("seconds", "accuracy", "epochs", "updates")
        }
        spread = max(r["accuracy"] for r in rs) - min(r["accuracy"] for r in rs)
        batches = sorted({b for r in rs for b in r["batches"]})
        summary[name] = {**med, "accuracy_spread": spread, "batches": batches}
        print(
            f"| {name} | {'/'.join(map(str, batches))} | {med['updates']:.0f} | "
            f"{med['epochs']:.0f} | {med['seconds']:.1f} s | {med['accuracy']:.3f} "
            f"(spread {spread:.3f}) |"
        )
    write(f"notebook_table_{args.backend}", runs=runs, median=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
