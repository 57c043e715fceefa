"""The batch search on a `tf.data` input, against the truth where `fit`
trains (issue 38; benchmarks/README.md).

    python tfdata_truth_child.py search LIMIT_BYTES [EPOCHS]
    python tfdata_truth_child.py fit BATCH [EPOCHS]

The MLP of user_process_child.py (784 -> 2048 -> 2048 -> 10, Adam, 16,384
samples) fed by `Dataset.from_tensor_slices((x, y)).shuffle(2048)`. "search":
`kerascale.find_batch_size(model, ds, memory_limit=LIMIT)`, then Keras's own
`fit` at the answer in the same process; "fit": Keras's own `fit` at BATCH in
a fresh process (glibc's mmap threshold fixed, as kerascale fixes it). EPOCHS
whole epochs, or 2 steps without it. Prints JSON with the resident memory
before `fit` and its peak (MiB)."""

import json
import os
import sys

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import tensorflow as tf
from user_process_child import build

import kerascale
from kerascale.sense import memory

mode, value = sys.argv[1], int(sys.argv[2])
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 0
model, shape, n = build("mlp")
rng = np.random.default_rng(0)
x = rng.random((n, *shape), dtype="float32")
y = rng.integers(0, 10, size=n)
ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=1)
out = {"mode": mode}
if mode == "search":
    r = kerascale.find_batch_size(
        model,
        ds,
        memory_limit=value,
        precision="float32",
        verbose=0,
        cache=False,
        recompute=False,
    )
    batch = r.batch_size
    out.update(
        answer=batch, why=r.reasons.get("batch_size"), memory=r.reasons.get("memory")
    )
else:
    batch = value
    memory.fix_mmap_threshold()
memory.release_freed()
out["before"] = round(memory.resident_bytes() / 2**20)
memory.reset_resident_peak()
if epochs:
    model.fit(ds.batch(batch), epochs=epochs, verbose=0)
else:
    model.fit(ds.batch(batch).repeat(), epochs=1, steps_per_epoch=2, verbose=0)
out.update(batch=batch, epochs=epochs, peak=round(memory.resident_peak_bytes() / 2**20))
print(json.dumps(out))
