"""A user's training script, for `benchmarks/user_process_truth.py`.

    python user_process_child.py MODE MODEL POLICY LIMIT_OR_BATCH

MODE:
- search-then-fit: `kerascale.find_batch_size(model, x, y, memory_limit=LIMIT)`,
  then Keras's own `model.fit(x, y, batch_size=answer)` in the same process;
- fit: Keras's own `model.fit` at BATCH in a fresh run of the same script
  (the data held as arrays, as the user's process holds it);
- fresh: one batch at BATCH in a process that holds nothing else (no data
  set: what a probe child holds), Keras's `fit` on one batch repeated.

EPOCHS (optional): train that many whole epochs instead of 2 steps (a
user's run; the peak grows with the epochs).

MODEL: "mlp" (784 -> 2048 -> 2048 -> 10 on 16,384 samples) or "cnn" (three
3x3 convolutions on 4,096 64x64x3 images, Adam). Prints JSON with the peak
resident memory (VmHWM) of the training, the batch, and the search's answer.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np


def build(name):
    keras.utils.set_random_seed(0)
    if name == "mlp":
        inputs = keras.Input((784,))
        h = keras.layers.Dense(2048, activation="relu")(inputs)
        h = keras.layers.Dense(2048, activation="relu")(h)
        outputs = keras.layers.Dense(10, activation="softmax")(h)
        shape, n = (784,), 16384
    else:
        inputs = keras.Input((64, 64, 3))
        h = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
        h = keras.layers.Conv2D(32, 3, activation="relu")(h)
        h = keras.layers.Conv2D(32, 3, activation="relu")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        outputs = keras.layers.Dense(10, activation="softmax")(h)
        shape, n = (64, 64, 3), 4096
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy")
    return model, shape, n


def main(mode, name, policy, value, epochs=0):
    from kerascale.apply import precision
    from kerascale.sense import memory

    model, shape, n = build(name)
    rng = np.random.default_rng(0)
    out = {"mode": mode, "model": name, "precision": policy}
    if mode == "fresh":
        batch = int(value)
        x = rng.random((batch, *shape), dtype="float32")
        y = np.zeros(batch, "int64")
        precision.apply(model, policy)
        memory.release_freed()
        memory.reset_resident_peak()
        model.fit(x, y, batch_size=batch, epochs=3, verbose=0)
        out.update(batch=batch, peak=memory.resident_peak_bytes())
        print(json.dumps(out))
        return
    x = rng.random((n, *shape), dtype="float32")  # resident, as data is
    y = rng.integers(0, 10, size=n)
    if mode == "search-then-fit":
        import time

        import kerascale

        start = time.perf_counter()
        r = kerascale.find_batch_size(
            model,
            x,
            y,
            memory_limit=int(value),
            precision=policy,
            verbose=0,
            cache=False,
            recompute=False,
        )
        batch = r.batch_size
        out.update(answer=batch, seconds=round(time.perf_counter() - start, 1))
        out["why"] = r.reasons.get("batch_size", "")
        out["memory"] = r.reasons.get("memory", "")
    else:
        batch = int(value)
        # What kerascale does in the process where fit trains, where a
        # resident limit counts it (memory.fix_mmap_threshold): the truth of
        # a batch is that process's.
        memory.fix_mmap_threshold()
    precision.apply(model, policy)
    memory.release_freed()  # as kerascale.fit does before it trains
    out["resident_before_fit"] = memory.resident_bytes()
    memory.reset_resident_peak()
    if epochs:  # a user's run: whole epochs
        model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    else:
        model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=2, verbose=0)
    out.update(batch=batch, epochs=epochs, peak=memory.resident_peak_bytes())
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:5], epochs=int(sys.argv[5]) if len(sys.argv) > 5 else 0)
