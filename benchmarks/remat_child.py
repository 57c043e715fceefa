"""One fresh process for benchmarks/remat.py: a deep MLP whose activations
dominate (gelu), trained for a few real steps at BATCH, with or without
recomputation set in place by kerascale (`kerascale.apply.remat`).

    python remat_child.py MODE BATCH        (MODE: none | activations)
    python remat_child.py plan BATCH LIMIT

Prints JSON: the peak resident memory (VmHWM: what a container's limit and
the OOM killer count) and the median seconds of a step after the first two.
With "plan": what `kerascale.plan` decides for `batch_size=BATCH` under
`memory_limit=LIMIT` (bytes), float32, for a run of 1,000 epochs: the
recomputation weighed against accumulation, with its figures and the seconds
planning took.
The backend is KERAS_BACKEND's.
"""

import json
import sys
import time

import keras
import numpy as np

DEPTH, WIDTH, FEATURES = 8, 1024, 256


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    h = inputs
    for _ in range(DEPTH):
        h = keras.layers.Dense(WIDTH, activation="gelu")(h)
    model = keras.Model(inputs, keras.layers.Dense(10)(h))
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def main(mode, batch, steps=6):
    from kerascale.apply import remat
    from kerascale.sense import memory

    model = build()
    if mode != "none":
        remat.apply(model, mode)
    batch = int(batch)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, FEATURES)).astype("float32")
    y = rng.integers(0, 10, batch)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model.train_on_batch(x, y)
        float(np.asarray(loss if np.ndim(loss) == 0 else loss[0]))  # waits
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "mode": mode,
                "batch": batch,
                "peak": memory.resident_peak_bytes(),
                "step_seconds": float(np.median(times[2:])),
            }
        )
    )


def plan(batch, limit):
    import kerascale

    rng = np.random.default_rng(0)
    n = 4 * int(batch)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = rng.integers(0, 10, n)
    start = time.perf_counter()
    # A long run (1,000 epochs): the weighing runs only where the run repays
    # it 10x (the trials' budget); a 1-epoch plan says "not weighed".
    p = kerascale.plan(
        build(),
        x,
        y,
        batch_size=int(batch),
        memory_limit=int(limit),
        precision="float32",
        remeasure=True,
        verbose=0,
        epochs=1000,
    )
    print(
        json.dumps(
            {
                "batch_size": int(batch),
                "recompute": p.recompute,
                "split": [p.micro_batch_size, p.replicas, p.accumulation_steps],
                "why": p.reasons.get("recompute", ""),
                "planning_seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "plan":
        plan(*sys.argv[2:4])
    else:
        main(*sys.argv[1:3])
