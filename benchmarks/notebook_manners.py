"""Issue 81's table, rerun in a Jupyter kernel (nbclient), as a data
scientist meets it: a misspelt keyword, `epochs="3"`, mismatched arrays,
`batch_size=0`, `history.plan` as a cell's value, `verbose=2`'s width, and
the trials' estimate against the run it was made for. Each mistake runs
beside plain `model.fit` with the same call, and the tracebacks the notebook
shows are counted (ANSI colours stripped).

    python3 -m venv /tmp/nbenv && /tmp/nbenv/bin/pip install -e ".[tensorflow]" \\
        nbclient nbformat ipykernel
    /tmp/nbenv/bin/python benchmarks/notebook_manners.py [--backend jax]

Prints one line a row and writes benchmarks/results/notebook_manners_<backend>.json.
Issue 81's bars: the typo fails in under 0.2 s with "did you mean"; each
traceback at most plain `fit`'s plus 10 lines; the plan shows its table; the
table at most 100 columns; the estimate within 2x of the run.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import write  # noqa: E402

SETUP = """
import os, tempfile, time
os.environ["KERAS_BACKEND"] = {backend!r}
os.environ["KERASCALE_CACHE_DIR"] = tempfile.mkdtemp()
import numpy as np, keras, kerascale
rng = np.random.default_rng(0)
X = rng.standard_normal((20000, 32)).astype("float32")
y = (X[:, :10].argmax(1)).astype("int32")
def build_model():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, "relu"),
                              keras.layers.Dense(128, "relu"),
                              keras.layers.Dense(10, "softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""

# (row, the plain call, kerascale's call): each cell raises or trains.
MISTAKES = [
    ("typo", "build_model().fit(X, y, epochs=100, validaton_split=0.2)",
     "kerascale.fit(build_model(), X, y, epochs=100, validaton_split=0.2)"),
    ("epochs='3'", 'build_model().fit(X, y, epochs="3")',
     'kerascale.fit(build_model(), X, y, epochs="3")'),
    ("y[:-1]", "build_model().fit(X, y[:-1], verbose=0)",
     "kerascale.fit(build_model(), X, y[:-1], verbose=0)"),
    ("batch_size=0", "build_model().fit(X, y, batch_size=0, verbose=0)",
     "kerascale.fit(build_model(), X, y, batch_size=0, verbose=0)"),
]  # fmt: skip

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def timed(call: str) -> str:
    return (
        f"_t = time.perf_counter()\ntry:\n    {call}\n"
        "finally:\n    print('SECONDS', time.perf_counter() - _t)"
    )


def run(backend: str) -> dict:
    import nbformat
    from nbclient import NotebookClient

    cells = [SETUP.format(backend=backend)]
    for _, plain, ours in MISTAKES:
        cells += [timed(plain), timed(ours)]
    cells.append(
        "_t = time.perf_counter()\n"
        "history = kerascale.fit(build_model(), X, y, epochs=20, verbose=2)\n"
        "print('SECONDS', time.perf_counter() - _t)"
    )
    cells.append("history.plan")
    cells.append(  # the issue's 100-epoch run: the trials' estimate against it
        "_t = time.perf_counter()\n"
        "kerascale.fit(build_model(), X, y, epochs=100, batch_size=32, verbose=2)\n"
        "print('SECONDS', time.perf_counter() - _t)"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=1800, allow_errors=True).execute()
    out = {"backend": backend, "rows": {}}
    for i, (row, _, _) in enumerate(MISTAKES):
        plain, ours = (_cell(nb.cells[1 + 2 * i + k]) for k in (0, 1))
        out["rows"][row] = {"plain": plain, "kerascale": ours}
    run_cell, plan_cell = _cell(nb.cells[-3]), nb.cells[-2]
    long_run = _cell(nb.cells[-1])
    said = re.search(
        r"trials took (\d+)s, \d+% of a run of about (\d+)s", long_run["stdout"]
    )
    out["estimate"] = {
        "trials_s": float(said.group(1)) if said else None,
        "said_run_s": float(said.group(2)) if said else None,
        "run_s": long_run["seconds"],
        "ratio": float(said.group(2)) / long_run["seconds"] if said else None,
        "said": [ln for ln in long_run["stdout"].splitlines() if "kerascale:" in ln],
    }
    stdout = run_cell["stdout"]
    plan_lines = [
        line for line in stdout.splitlines() if not re.match(r"(Epoch |\d+/\d+ )", line)
    ]
    widest = max(plan_lines, key=len)
    out["verbose2"] = {
        "widest": len(widest),
        "widest_line": widest,
        "seconds": run_cell["seconds"],
    }
    data = plan_cell.outputs[0].get("data", {}) if plan_cell.outputs else {}
    out["plan_cell"] = {
        "html_table": "<pre>kerascale plan" in data.get("text/html", ""),
        "text_table": data.get("text/plain", "").startswith("kerascale plan"),
        "text_plain": data.get("text/plain", "")[:200],
    }
    return out


def _cell(cell) -> dict:
    error = next((o for o in cell.outputs if o.output_type == "error"), None)
    stdout = "".join(
        o.get("text", "") for o in cell.outputs if o.get("name") == "stdout"
    )
    seconds = re.findall(r"SECONDS ([0-9.]+)", stdout)
    traceback = ANSI.sub("", "\n".join(error.traceback)) if error else ""
    return {
        "error": f"{error.ename}: {error.evalue}"[:300] if error else None,
        "traceback_lines": len(traceback.splitlines()),
        "seconds": float(seconds[-1]) if seconds else None,
        "stdout": stdout[-20000:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow")
    args = parser.parse_args()
    out = run(args.backend)
    for row, both in out["rows"].items():
        p, k = both["plain"], both["kerascale"]
        print(
            f"{row:14} plain: {p['error'] or 'trained'} ({p['traceback_lines']} lines, "
            f"{p['seconds']:.2f}s) | kerascale: {k['error'] or 'trained'} "
            f"({k['traceback_lines']} lines, {k['seconds']:.2f}s)"
        )
        both["plain"].pop("stdout")
        both["kerascale"].pop("stdout")
    print("verbose=2:", out["verbose2"], "| plan cell:", out["plan_cell"])
    print("estimate:", out["estimate"])
    write(f"notebook_manners_{args.backend}", **out)


if __name__ == "__main__":
    main()
