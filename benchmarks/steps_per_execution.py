"""What the host path between steps costs a small model (issue 59):
`kerascale.fit` against plain `model.fit`, and plain `model.fit` with
`compile(steps_per_execution=N)`, on the backend of the environment it runs
in.

    .venv/bin/python benchmarks/steps_per_execution.py [--seconds 30]
        [--rounds 3] [--spe 16,64]
    .venv/bin/python benchmarks/steps_per_execution.py --epochs 30   # issue 79
    .venv-jax/bin/python benchmarks/steps_per_execution.py ...   # JAX

The issue's model: a 32-64-10 MLP with Adam, on 8,192 NumPy samples at batch
32, shuffled, float32. The epochs are set so that plain `fit` trains about
`--seconds` (timed from one plain epoch), or are `--epochs` (issue 79: a
notebook's 30-epoch run, where the choice must cost next to nothing).
`--task cnn`: a small CNN on 64x64x3 images at batch 64, whose step takes
tens of milliseconds (where the choice must cost nothing). Each round
runs, in one process:

- plain: `model.fit(x, y, batch_size=32, epochs=E)`, what a user writes;
- plain, N steps a call: the same model compiled with
  `steps_per_execution=N` (the lever; no one sets it for them), for each N
  of `--spe`;
- kerascale: `kerascale.fit(model, x, y, batch_size=32, precision="float32",
  epochs=E)` from a fresh cache (`KERASCALE_CACHE_DIR` a new directory each
  round), its planning included in its time.

Each is timed from its call to its return (a fresh model each, built and
compiled outside the timing), and each trains from the same seed, so the
weights are compared too: plain with N steps a call and kerascale against
plain (float noise only where nothing else differs). Medians over rounds.

Writes benchmarks/results/steps_per_execution_<backend>.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The environment's backend: .venv-jax has no TensorFlow.
has_tf = importlib.util.find_spec("tensorflow") is not None
os.environ.setdefault("KERAS_BACKEND", "tensorflow" if has_tf else "jax")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _results import write as write_results  # noqa: E402

import kerascale  # noqa: E402

SAMPLES, FEATURES, CLASSES, BATCH = 8192, 32, 10, 32
# `--task cnn` (issue 79: where a step is long, the choice costs nothing):
# a small CNN on 64x64x3 images at batch 64, a step of tens of milliseconds.
TASK = "mlp"
IMAGES, SIDE, CNN_BATCH = 2048, 64, 64


def layers() -> list:
    if TASK == "cnn":
        return [
            keras.Input((SIDE, SIDE, 3)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    return [
        keras.Input((FEATURES,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(CLASSES),
    ]


def make_model(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(layers())
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if TASK == "cnn":
        x = rng.normal(size=(IMAGES, SIDE, SIDE, 3)).astype("float32")
        return x, rng.integers(0, CLASSES, IMAGES).astype("int32")
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, SAMPLES).astype("int32")
    return x, y


CHOSEN: list[str] = []  # kerascale's steps per call and reason, each round


def run(kind: str, x, y, epochs: int) -> tuple[float, list[np.ndarray]]:
    """One run of `kind` ("plain", "plain_spe<N>", "kerascale"): its seconds
    from the call to the return, and the weights it trained."""
    spe = int(kind[len("plain_spe") :]) if kind.startswith("plain_spe") else 1
    model = make_model(spe)
    batch = CNN_BATCH if TASK == "cnn" else BATCH
    keras.utils.set_random_seed(1)  # the same shuffles for every kind
    if kind == "kerascale":
        with tempfile.TemporaryDirectory(prefix="kerascale-cache-") as cache:
            os.environ["KERASCALE_CACHE_DIR"] = cache
            started = time.perf_counter()
            history = kerascale.fit(
                model,
                x,
                y,
                batch_size=batch,
                precision="float32",
                epochs=epochs,
                verbose=0,
            )
            seconds = time.perf_counter() - started
            plan = history.plan
            why = plan.reasons.get("steps_per_execution", "")
            CHOSEN.append(f"{plan.steps_per_execution}: {why}")
            print(f"  kerascale's steps per call {CHOSEN[-1]}", flush=True)
    else:
        started = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=True, verbose=0)
        seconds = time.perf_counter() - started
    return seconds, [np.asarray(w) for w in model.get_weights()]


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="plain fit's time")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, help="the run's epochs (else --seconds)")
    p.add_argument("--task", choices=("mlp", "cnn"), default="mlp")
    p.add_argument(
        "--spe", default="16", help="steps a call set by hand, comma-separated"
    )
    args = p.parse_args()
    global TASK
    TASK = args.task
    backend = keras.backend.backend()
    x, y = data()
    by_hand = [int(n) for n in args.spe.split(",")]
    run("plain", x, y, 1)  # imports and caches warm
    for n in by_hand:
        run(f"plain_spe{n}", x, y, 1)
    run("kerascale", x, y, 1)
    CHOSEN.clear()
    if args.epochs:
        epochs, timing = args.epochs, ""
    else:
        # An epoch's time apart from the call's own (a fresh model compiles).
        short, _ = run("plain", x, y, 2)
        longer, _ = run("plain", x, y, 12)
        per_epoch = max((longer - short) / 10, 1e-3)
        start = max(short - 2 * per_epoch, 0.0)
        epochs = max(1, round((args.seconds - start) / per_epoch))
        timing = f" (plain: {per_epoch:.3f} s an epoch, {start:.1f} s to start)"
    what = (
        f"CNN, {IMAGES} images {SIDE}x{SIDE}x3 at batch {CNN_BATCH}"
        if TASK == "cnn"
        else f"32-64-10 MLP, {SAMPLES} samples at batch {BATCH}"
    )
    print(f"{backend}: {what}, {epochs} epochs{timing}", flush=True)
    kinds = ("plain", *(f"plain_spe{n}" for n in by_hand), "kerascale")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    differences: dict[str, list[float]] = {k: [] for k in kinds[1:]}
    for r in range(args.rounds):
        weights = {}
        # Each round starts one contestant later: none always runs after
        # the same other (what a process did before shows in the next run).
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            seconds, weights[kind] = run(kind, x, y, epochs)
            times[kind].append(seconds)
            print(f"round {r + 1} {kind}: {seconds:.2f} s", flush=True)
        for kind in differences:
            difference = largest_difference(weights[kind], weights["plain"])
            differences[kind].append(difference)
    plain = statistics.median(times["plain"])
    print(f"\n{backend}, medians of {args.rounds} rounds")
    best = min(statistics.median(times[f"plain_spe{n}"]) for n in by_hand)
    print(
        "| run | wall | speed against plain | against the best by hand "
        "| largest weight difference |"
    )
    print("|---|---|---|---|---|")
    names = {
        "plain": "plain model.fit",
        **{f"plain_spe{n}": f"plain, steps_per_execution={n}" for n in by_hand},
        "kerascale": "kerascale.fit (fresh cache, planning included)",
    }
    for kind in kinds:
        t = statistics.median(times[kind])
        diff = f"{max(differences[kind]):.2g}" if kind in differences else ""
        print(
            f"| {names[kind]} | {t:.2f} s | {plain / t:.2f}x | {best / t:.2f}x "
            f"| {diff} |"
        )
    write_results(
        f"steps_per_execution_{backend}"
        + (f"_{TASK}" if TASK != "mlp" else "")
        + (f"_{args.epochs}_epochs" if args.epochs else ""),
        backend=backend,
        epochs=epochs,
        steps_per_execution=by_hand,
        kerascale_chose=CHOSEN,
        seconds=times,
        largest_weight_difference=differences,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
