"""Time to a good model, not samples per second (issue 78): wall time and
held-out accuracy of plain `model.fit`, `kerascale.fit` with the same call,
and the best a competent user sets by hand.

    KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/time_to_accuracy.py
    .venv-jax/bin/python benchmarks/time_to_accuracy.py   # JAX
        [--tasks tabular,cnn,sequence] [--seeds 3] [--epochs 20] [--no-stop]

Each task is what a notebook runs: arrays, `validation_split=0.2`,
`EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True)`,
up to 20 epochs, Adam at Keras's learning rate, accuracy on held-out data.
`--no-stop` leaves `EarlyStopping` out (every epoch runs: a fixed budget of
`--epochs`), and the results file gets `_no_stop` in its name.

- `tabular`: issue 78's notebook, 20,000 x 32 features, 10 classes (a noisy
  linear teacher), a 128-128-10 MLP.
- `cnn`: the quickstart's CNN on its 32x32x3 images (examples/quickstart.py).
- `sequence`: 40 steps of 8 features, the class the sign of a weighted sum
  over time, a Conv1D model.
- `digits`: real data, the UCI handwritten digits that scikit-learn ships
  (1,400 to train, 397 held out), a 64-64-10 MLP. Needs scikit-learn
  installed (`pip install scikit-learn`); its data file is read, sklearn
  is not imported.

Contestants, in one process, alternating, per seed (median of the seeds):

- plain: `model.fit(x, y, validation_split=0.2, epochs=20, callbacks=[es])`;
- kerascale: `kerascale.fit(model, x, y, ...)`, the same call, from a fresh
  cache (its planning in the time);
- guide (with `--guide`): docs/batch-search.md followed to its next line,
  `find_batch_size(model, x, y, memory_limit="6GiB")` then `kerascale.fit`
  with its `fit_kwargs()` (the search in the time, from a fresh cache);
- by hand: the fastest of batch 32, 128 and 512 with `steps_per_execution=32`
  and Adam's learning rate scaled by sqrt(batch / 32) (Malladi et al. 2022),
  among those within 0.01 of plain's accuracy.

The goal (issue 78): on every task kerascale's accuracy at least plain's minus
0.01 (or the seeds' spread) and its time at most plain's; the geometric mean
of kerascale's time over plain's at most 0.67 on each backend. Writes
`benchmarks/results/time_to_accuracy_<backend>.json`.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import keras
import numpy as np
from _results import write

import kerascale

EPOCHS = 20
BY_HAND = (32, 128, 512)


def tabular(seed):
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(32, 10))
    x = rng.normal(size=(24_000, 32)).astype("float32")
    y = np.argmax(x @ teacher + 1.5 * rng.normal(size=(24_000, 10)), axis=1)

    def model(learning_rate=1e-3, steps_per_execution=1):
        m = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        _compile(m, learning_rate, steps_per_execution)
        return m

    return model, (x[:20_000], y[:20_000]), (x[20_000:], y[20_000:])


def cnn(seed):
    from quickstart import make_data, make_model

    x, y = make_data(2048, seed=seed)
    test = make_data(512, seed=seed + 1000)

    def model(learning_rate=1e-3, steps_per_execution=1):
        m = make_model()  # the quickstart's, compiled again at this rate
        _compile(m, learning_rate, steps_per_execution)
        return m

    return model, (x, y), test


def sequence(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(10_000, 40, 8)).astype("float32")
    weights = np.linspace(-1, 1, 40)[:, None] * rng.normal(size=(1, 8))
    y = (np.einsum("ntf,tf->n", x, weights) > 0).astype("int32")

    def model(learning_rate=1e-3, steps_per_execution=1):
        m = keras.Sequential(
            [
                keras.Input((40, 8)),
                keras.layers.Conv1D(32, 5, activation="relu"),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(2, activation="softmax"),
            ]
        )
        _compile(m, learning_rate, steps_per_execution)
        return m

    return model, (x[:8_000], y[:8_000]), (x[8_000:], y[8_000:])


def digits(seed):
    """Real data: the UCI handwritten digits (1,797 images of 8x8, 10
    classes), as scikit-learn ships them. Read as a file from its
    installed wheel; sklearn is never imported (a TensorFlow process that
    imported it would carry it into kerascale's probes)."""
    x, y = _digits()
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]

    def model(learning_rate=1e-3, steps_per_execution=1):
        m = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        _compile(m, learning_rate, steps_per_execution)
        return m

    return model, (x[:1400], y[:1400]), (x[1400:], y[1400:])


def _digits():
    from importlib import metadata

    try:
        dist = metadata.distribution("scikit-learn")
    except metadata.PackageNotFoundError:
        sys.exit(
            "the digits task reads the UCI digits from scikit-learn's wheel: "
            "pip install scikit-learn (it is read as a file, not imported)"
        )
    for f in dist.files or ():
        if str(f).endswith("datasets/data/digits.csv.gz"):
            table = np.loadtxt(dist.locate_file(f), delimiter=",")
            return (table[:, :-1] / 16).astype("float32"), table[:, -1].astype("int32")
    sys.exit("scikit-learn's wheel holds no datasets/data/digits.csv.gz")


TASKS = {"tabular": tabular, "cnn": cnn, "sequence": sequence, "digits": digits}


def _compile(model, learning_rate, steps_per_execution):
    model.compile(
        keras.optimizers.Adam(learning_rate),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )


# Set by `main` from --epochs and --no-stop.
STOP = True


def run(fit, build, train, test, seed, settings=None, **kwargs):
    """(seconds from the model's build to fit's return, held-out accuracy,
    epochs run)."""
    keras.utils.set_random_seed(seed)
    start = time.perf_counter()
    model = build(**(settings or {}))
    stop = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=3, restore_best_weights=True
    )
    history = fit(
        model, *train, validation_split=0.2, epochs=EPOCHS,
        callbacks=[stop] if STOP else [], verbose=0, **kwargs,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(*test, verbose=0)
    batch = getattr(getattr(history, "plan", None), "global_batch_size", None)
    # A batch grown in the run: the batches it trained at, in order.
    grown = list(dict.fromkeys(int(b) for b in history.history.get("batch_size", [])))
    return {
        "seconds": seconds,
        # The guide's search (cached for the next run of the same model and
        # data): its fit alone is `seconds` less this.
        "search_seconds": getattr(history, "search_seconds", 0.0),
        "accuracy": float(accuracy),
        "epochs": len(history.history["loss"]),
        "batch": batch or kwargs.get("batch_size", 32),
        "batches": grown or [batch or kwargs.get("batch_size", 32)],
    }


def plain_fit(model, *args, **kwargs):
    return model.fit(*args, **kwargs)


def kerascale_fit(model, *args, **kwargs):
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        os.environ["KERASCALE_CACHE_DIR"] = cache
        return kerascale.fit(model, *args, **kwargs)


# The batch-size guide's memory limit (docs/batch-search.md's first sample).
GUIDE_LIMIT = "6GiB"


def guide_fit(model, x, y, *, callbacks, **kwargs):
    """docs/batch-search.md followed to its next line: the search, then
    `fit` with the answer's `fit_kwargs()` (fresh cache, the search timed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        os.environ["KERASCALE_CACHE_DIR"] = cache
        began = time.perf_counter()
        found = kerascale.find_batch_size(
            model, x, y, memory_limit=GUIDE_LIMIT, verbose=0
        )
        searched = time.perf_counter() - began
        history = kerascale.fit(
            model, x, y, **kwargs, **found.fit_kwargs(callbacks=callbacks)
        )
        history.search_seconds = searched
        print(
            f"  guide: answer {found.batch_size}, trained at "
            f"{history.plan.global_batch_size}, search {searched:.1f}s",
            flush=True,
        )
        return history


def main():
    global EPOCHS, STOP
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--guide",
        action="store_true",
        help="add docs/batch-search.md's search and its fit_kwargs() as a contestant",
    )
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument(
        "--no-stop", action="store_true", help="no EarlyStopping: every epoch runs"
    )
    args = parser.parse_args()
    EPOCHS, STOP = args.epochs, not args.no_stop
    backend = keras.backend.backend()
    results = {}
    for name in args.tasks.split(","):
        rows = {"plain": [], "kerascale": [], "by hand": []}
        if args.guide:
            rows["guide"] = []
        for seed in range(args.seeds):
            build, train, test = TASKS[name](seed)
            rows["plain"].append(run(plain_fit, build, train, test, seed))
            rows["kerascale"].append(run(kerascale_fit, build, train, test, seed))
            hand = [
                run(
                    plain_fit,
                    build,
                    train,
                    test,
                    seed,
                    batch_size=b,
                    settings={
                        "learning_rate": 1e-3 * math.sqrt(b / 32),
                        "steps_per_execution": 32,
                    },
                )
                for b in BY_HAND
            ]
            if args.guide:
                rows["guide"].append(run(guide_fit, build, train, test, seed))
            good = [
                h for h in hand if h["accuracy"] >= rows["plain"][-1]["accuracy"] - 0.01
            ]
            rows["by hand"].append(min(good or hand, key=lambda h: h["seconds"]))
            print(name, seed, {k: v[-1] for k, v in rows.items()}, flush=True)
        results[name] = {
            who: {
                "seconds": statistics.median(r["seconds"] for r in runs),
                "fit_seconds": statistics.median(
                    r["seconds"] - r["search_seconds"] for r in runs
                ),
                "accuracy": statistics.median(r["accuracy"] for r in runs),
                "accuracy_spread": max(r["accuracy"] for r in runs)
                - min(r["accuracy"] for r in runs),
                "epochs": statistics.median(r["epochs"] for r in runs),
                "batches": [r["batches"] for r in runs],
                "runs": runs,
            }
            for who, runs in rows.items()
        }
    ratios = [
        r["kerascale"]["seconds"] / r["plain"]["seconds"] for r in results.values()
    ]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"\n{backend}: task, contestant, median seconds, accuracy (spread), epochs")
    for name, r in results.items():
        for who, m in r.items():
            searched = (
                f" (fit {m['fit_seconds']:.1f} s)"
                if m["fit_seconds"] != m["seconds"]
                else ""
            )
            print(
                f"  {name:9} {who:10} {m['seconds']:7.1f} s{searched}  "
                f"{m['accuracy']:.3f} ({m['accuracy_spread']:.3f})  "
                f"{m['epochs']:>4}  batch {m['batches']}"
            )
    print(f"geometric mean of kerascale / plain time: {geomean:.2f} (goal <= 0.67)")
    name = f"time_to_accuracy_{backend}" + ("" if STOP else "_no_stop")
    write(name, tasks=results, geomean_ratio=geomean, epochs=EPOCHS, stop=STOP)


if __name__ == "__main__":
    main()
