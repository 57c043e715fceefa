"""End to end on JAX as the user waits for it (issue 39): wall time,
planning included, from a fresh cache, against plain `model.fit`.

    .venv-jax/bin/python benchmarks/jax_wall_time.py [--minutes 1,5] [--rounds 1]

The workload is `jax_end_to_end.py`'s: the reference CNN on 4096 uint8
images in NumPy arrays, `Rescaling` in the model, Keras's `shuffle=True`, as
a JAX user without TensorFlow feeds it. For runs of about 1 and 5 minutes of
plain `model.fit` (epochs set from a first timed plain run), two contestants
train the same epochs, each in a fresh model, timed from the model's build
to `fit`'s return, in alternating order:

- plain: `model.fit(x, y, epochs=E)`, Keras's defaults (batch 32, float32).
  On this CPU that is also the expert's configuration: the best point of
  `jax_end_to_end.py`'s grid (batch {32, 128, 512} x {float32,
  mixed_bfloat16}), since XLA's CPU code runs this CNN fastest at Keras's
  default;
- kerascale: `kerascale.fit(model, x, y, epochs=E)` with every default and
  an empty cache (its search and trials in the time).

Goals (issue 39): never slower than plain, and at least 0.8 (1 minute) and
0.95 (5 minutes) of the expert's speed. Writes
`benchmarks/results/jax_wall_time.json`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras
from _results import write
from jax_end_to_end import data, model

import kerascale


def plain(x, y, epochs: int) -> tuple[float, dict]:
    start = time.perf_counter()
    model().fit(x, y, epochs=epochs, verbose=0)
    return time.perf_counter() - start, {}


def ours(x, y, epochs: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["KERASCALE_CACHE_DIR"] = cache
        start = time.perf_counter()
        history = kerascale.fit(model(), x, y, epochs=epochs, verbose=0)
        seconds = time.perf_counter() - start
    plan = history.plan
    return seconds, {
        "batch": plan.global_batch_size,
        "precision": plan.precision,
        "reasons": dict(plan.reasons),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", default="1,5")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    x, y = data()
    one_epoch = plain(x, y, 2)[0] / 2  # the first epoch compiles: 2 averaged
    rows = []
    for minutes in map(float, args.minutes.split(",")):
        epochs = max(1, round(minutes * 60 / one_epoch))
        for r in range(args.rounds):
            order = [plain, ours] if r % 2 == 0 else [ours, plain]
            seconds, chose = {}, {}
            for contestant in order:
                keras.utils.set_random_seed(0)
                took, said = contestant(x, y, epochs)
                seconds[contestant.__name__] = took
                chose = said or chose
            ratio = seconds["plain"] / seconds["ours"]
            rows.append(
                {
                    "minutes": minutes,
                    "epochs": epochs,
                    "round": r + 1,
                    "plain_s": round(seconds["plain"], 1),
                    "kerascale_s": round(seconds["ours"], 1),
                    "vs_plain_and_expert": round(ratio, 3),
                    "chose": chose,
                }
            )
            print(
                f"{epochs} epochs (~{minutes:g} min): plain (= the expert's "
                f"configuration) {seconds['plain']:.1f}s, kerascale "
                f"{seconds['ours']:.1f}s (batch {chose['batch']}, "
                f"{chose['precision']}): {ratio:.2f} of plain's speed",
                flush=True,
            )
    write("jax_wall_time", expert={"batch": 32, "precision": "float32"}, rows=rows)


if __name__ == "__main__":
    main()
