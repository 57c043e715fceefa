"""What planning adds to a `fit` call that measures nothing (issue 39's bar:
at most 50 ms over `model.fit`, the median of 20 alternating calls).

A user's small model on a CPU, built fresh for each call (a new model is
the expensive case: nothing is cached on it), trained one epoch on 512
samples of NumPy arrays at Keras's default batch: `model.fit(x, y)` against
`kerascale.fit(model, x, y)`, alternating, each in float32 as the user wrote
it (what kerascale picks for a run this short). The per-call difference of
the medians is the overhead; the same figures with the batch search's cache
warm are what a second run of a notebook cell pays.

`--first-calls N` also times the first call of N fresh processes each way
(alternating): `model.fit` against `import kerascale` plus `kerascale.fit`,
what one call in a new script or a test file pays once.

    .venv/bin/python benchmarks/planning_overhead.py        # TensorFlow
    KERAS_BACKEND=jax .venv-jax/bin/python benchmarks/planning_overhead.py

Writes benchmarks/results/planning_overhead_BACKEND.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

# kerascale is imported in main() and in a first-call child that asks for it:
# the plain child must not pay for it.

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results


def model() -> keras.Model:
    m = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    m.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return m


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(512, 32)).astype("float32"), rng.integers(0, 10, 512)


def first_call_child(way: str) -> None:
    """One fresh process's first call, `way` "plain" or "kerascale" (with
    its import), in seconds as JSON."""
    m, (x, y) = model(), data()
    start = time.perf_counter()
    if way == "kerascale":
        import kerascale

        kerascale.fit(m, x, y, epochs=1, verbose=0)
    else:
        m.fit(x, y, epochs=1, verbose=0)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def first_calls(n: int) -> dict[str, float]:
    """The median first call of `n` fresh processes each way, alternating."""
    times: dict[str, list[float]] = {"plain": [], "kerascale": []}
    for _ in range(n):
        for way in times:
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--first-call-child", way],
                capture_output=True,
                text=True,
                check=True,
                timeout=300,
            )
            seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
            times[way].append(seconds)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--first-calls", type=int, default=0)
    parser.add_argument("--first-call-child", choices=("plain", "kerascale"))
    args = parser.parse_args()
    if args.first_call_child:
        return first_call_child(args.first_call_child)
    import kerascale

    x, y = data()

    def plain() -> float:
        m = model()
        start = time.perf_counter()
        m.fit(x, y, epochs=1, verbose=0)
        return time.perf_counter() - start

    def ours() -> float:
        m = model()
        start = time.perf_counter()
        kerascale.fit(m, x, y, epochs=1, verbose=0)
        return time.perf_counter() - start

    plain(), ours()  # imports, Keras's first traces of its own code
    times: dict[str, list[float]] = {"plain": [], "kerascale": []}
    for _ in range(args.calls):
        times["plain"].append(plain())
        times["kerascale"].append(ours())
    medians = {k: statistics.median(v) for k, v in times.items()}
    overhead_ms = 1000 * (medians["kerascale"] - medians["plain"])
    plan = kerascale.plan(model(), x, y, verbose=0)
    backend = keras.backend.backend()
    first = first_calls(args.first_calls) if args.first_calls else {}
    _results.write(
        f"planning_overhead_{backend}",
        backend=backend,
        first_call_seconds={k: round(v, 3) for k, v in first.items()},
        tensorflow_installed=_tensorflow_installed(),
        precision=plan.precision,
        calls=args.calls,
        median_seconds={k: round(v, 4) for k, v in medians.items()},
        overhead_ms=round(overhead_ms, 1),
        seconds={k: [round(t, 4) for t in v] for k, v in times.items()},
    )
    print(
        f"{backend}: model.fit {medians['plain'] * 1000:.0f} ms, kerascale.fit "
        f"{medians['kerascale'] * 1000:.0f} ms (median of {args.calls}): "
        f"{overhead_ms:+.0f} ms a call; plan precision {plan.precision}"
    )
    if first:
        print(
            f"first call of a fresh process (median of {args.first_calls}): "
            f"model.fit {first['plain'] * 1000:.0f} ms, import kerascale + "
            f"kerascale.fit {first['kerascale'] * 1000:.0f} ms"
        )


def _tensorflow_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


if __name__ == "__main__":
    main()
