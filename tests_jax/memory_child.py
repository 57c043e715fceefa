"""A fresh JAX process for the batch search's truth (used by
tests_jax/test_compiled_search.py and benchmarks/jax_batch_search.py).

    python memory_child.py search MODEL POLICY LIMIT_BYTES
        kerascale.find_batch_size under memory_limit=LIMIT: prints JSON with
        the batch found, the bracket, the compiles and their seconds.
    python memory_child.py search-then-step MODEL POLICY LIMIT_BYTES
        the same search, then `kerascale.plan`'s check of the batch found
        ("plan_steps": its accumulation steps) and one real step at it in
        this same process (as fit trains after planning): adds its peak
        resident memory (VmHWM) to the JSON as "peak".
    python memory_child.py step MODEL POLICY BATCH [STOP_ABOVE]
        two real training steps at BATCH (Keras's own fit on the arrays, the
        policy set as kerascale sets it: in place), then prints JSON with the
        process's peak resident memory (VmHWM), which is what a container's
        limit and the kernel's OOM killer count. With STOP_ABOVE (bytes), it
        stops as soon as that peak passes it, as the OOM killer would, and
        prints the peak so far ("stopped": true).

Both build the same model on the same data, held in memory as a user's
process holds it (the truth is the process where fit trains: its data, and
what Keras's fit builds from it, count), so that each starts from the same
resident memory; a step is one of Keras's own `fit` on those arrays.
Where several devices are visible
(XLA_FLAGS=--xla_force_host_platform_device_count=N) standing in for GPUs
(KERASCALE_CPU_DEVICES_STAND_IN=1, set by the suite's conftest), the search
plans keras.distribution.DataParallel over them by itself, as kerascale.fit does,
and a step trains under it; BATCH (like the batch found) is each
replica's share.
"""

import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests_common"))
import peak_watch

SAMPLES = 16_384


def build(name):
    keras.utils.set_random_seed(0)
    if name == "mlp":
        inputs = keras.Input((784,))
        h = keras.layers.Dense(2048, activation="relu")(inputs)
        h = keras.layers.Dense(2048, activation="relu")(h)
        outputs = keras.layers.Dense(10)(h)
        shape = (784,)
    elif name == "cnn":
        inputs = keras.Input((32, 32, 3))
        h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(inputs)
        h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
        h = keras.layers.MaxPooling2D()(h)
        h = keras.layers.Flatten()(h)
        outputs = keras.layers.Dense(10)(h)
        shape = (32, 32, 3)
    else:
        raise SystemExit(f"unknown model {name}")
    model = keras.Model(inputs, outputs)
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    x = np.ones((SAMPLES, *shape), "float32")  # resident, as a user's data is
    y = np.zeros(SAMPLES, "int32")
    return model, x, y


def peak_resident():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def main(mode, name, policy, value, stop=None):
    import jax

    import kerascale

    replicas = len(jax.devices())
    if replicas > 1 and mode == "step":  # the search plans DataParallel itself
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    model, x, y = build(name)
    if mode in ("search", "search-then-step"):
        start = time.perf_counter()
        # cache=False: each run measures (a cached answer would time nothing).
        r = kerascale.find_batch_size(
            model,
            x,
            y,
            memory_limit=int(value),
            precision=policy,
            cache=False,
            recompute=False,
        )
        answer = {
            "batch": r.per_replica_batch_size,
            "fits": r.largest_fitting,
            "fails": r.smallest_failing,
            "compiles": len(r.probes),
            "compile_seconds": sum(p.seconds for p in r.probes),
            "seconds": time.perf_counter() - start,
            "why": r.reasons["batch_size"],
        }
        if mode == "search-then-step":
            from kerascale.sense import memory

            # The guide's next line (docs/batch-search.md): fit's check of
            # the answer, as a dry run, before the step at it.
            checked = kerascale.plan(
                model,
                x,
                y,
                batch_size=r.batch_size,
                precision=policy,
                memory_limit=int(value),
                verbose=0,
            )
            answer["plan_steps"] = checked.accumulation_steps
            answer["plan_explained"] = checked.explain()
            memory.release_freed()  # as fit does before it trains
            answer["peak"] = step(model, x, y, policy, r.per_replica_batch_size)
        print(json.dumps(answer))
        return
    batch = int(value)
    if stop:
        peak_watch.stop_above(int(stop))
    print(json.dumps({"batch": batch, "peak": step(model, x, y, policy, batch)}))


def step(model, x, y, policy, batch):
    """One real step at per-replica `batch`, `policy` set in place as
    kerascale sets it; the process's peak resident memory."""
    import jax

    from kerascale.apply import precision

    replicas = len(jax.devices())
    precision.apply(model, policy)
    model.fit(x, y, batch_size=batch * replicas, epochs=1, steps_per_epoch=2, verbose=0)
    return peak_resident()


if __name__ == "__main__":
    main(*sys.argv[1:6])
