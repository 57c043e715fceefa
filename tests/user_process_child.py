"""A user's training script, for the batch search's truth: the process where
`fit` trains holds the data (as arrays) and runs Keras's `fit` on them.

    python user_process_child.py search-then-fit LIMIT_BYTES
        kerascale.find_batch_size under memory_limit=LIMIT, then Keras's own
        `model.fit` at the batch found in this same process; prints JSON:
        the answer, its bracket, and fit's peak resident memory (VmHWM).
    python user_process_child.py MODE VALUE EPOCHS
        as above, `fit` training EPOCHS whole epochs instead of 2 steps.
    python user_process_child.py fit BATCH
        Keras's own `model.fit` at BATCH on the same data and model, with
        nothing else done before; prints JSON with the peak (VmHWM).
    python user_process_child.py fit BATCH 0 STOP_ABOVE
        as above, but stops as soon as the peak passes STOP_ABOVE bytes (as
        the OOM killer would), printing the peak so far.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests_common"))
import peak_watch
from probe_helpers import wide_mlp

SAMPLES = 16384


def main(mode, value, epochs=0, stop=0):
    from kerascale.sense import memory

    keras.utils.set_random_seed(0)
    model = wide_mlp()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 64)).astype("float32")  # resident, as data is
    y = rng.integers(0, 10, size=SAMPLES)
    out = {}
    batch = int(value)
    if mode == "search-then-fit":
        import kerascale

        r = kerascale.find_batch_size(
            model,
            x,
            y,
            memory_limit=int(value),
            precision="float32",
            verbose=0,
            cache=False,
            margin=0.03,
            recompute=False,
        )
        batch = r.batch_size
        out = {
            "batch": batch,
            "fits": r.largest_fitting,
            "fails": r.smallest_failing,
            "granularity": r.granularity,
            "probes": len(r.probes),
            "reasons": r.reasons,
        }
    # As kerascale does in the process where fit trains under a resident
    # limit (the search did it in search-then-fit).
    memory.fix_mmap_threshold()
    memory.release_freed()  # as kerascale.fit does before it trains
    memory.reset_resident_peak()
    if stop:
        peak_watch.stop_above(stop)
    if epochs:  # a user's run: whole epochs (the peak grows with them)
        model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    else:
        model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=2, verbose=0)
    out["peak"] = memory.resident_peak_bytes()
    print(json.dumps(out))


if __name__ == "__main__":
    extra = [int(a) for a in sys.argv[3:5]]
    main(*sys.argv[1:3], *extra)
