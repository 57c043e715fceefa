"""The batch-size guide's first sample (docs/batch-search.md), as a new user
runs it: a small CNN on 4,000 28x28x1 images held as arrays, searched under a
real `memory_limit`, then trained with what it found in the same process.

`python guide_sample.py LIMIT [search]`: prints one JSON line with the
answer, the bound with recomputation, the warnings said, `plan`'s check of
the answer (its accumulation steps and `explain()`), and the peak
resident memory (VmHWM, reset before `fit`) of the `fit` that follows, in
this process (`search`: the search only, no `fit`; "peak" is then null).
On either backend (KERAS_BACKEND); issue 55, point 1.
"""

import json
import sys
import warnings

import keras
import numpy as np

import kerascale
from kerascale.sense import memory


def main(limit: str, fit: bool = True) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.rand(4000, 28, 28, 1).astype("float32")
    y = np.random.randint(0, 2, 4000)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = kerascale.find_batch_size(
            model, x, y, memory_limit=limit, cache=False, verbose=0
        )
        # The guide's next line, as a dry run: fit's check of the answer.
        checked = kerascale.plan(
            model,
            x,
            y,
            batch_size=result.batch_size,
            precision=result.precision,
            memory_limit=limit,
            verbose=0,
        )
        memory.reset_resident_peak()
        if fit:
            kerascale.fit(
                model,
                x,
                y,
                batch_size=result.batch_size,
                precision=result.precision,
                memory_limit=limit,
                epochs=1,
                verbose=0,
            )
    print(
        json.dumps(
            {
                "batch": result.batch_size,
                "fits": result.largest_fitting,
                "fails": result.smallest_failing,
                "granularity": result.granularity,
                "precision": result.precision,
                "recompute_batch": result.recompute_batch_size,
                "reasons": {k: str(v) for k, v in result.reasons.items()},
                "warnings": [
                    str(w.message)
                    for w in said
                    if issubclass(w.category, kerascale.KerascaleWarning)
                ],
                "plan_steps": checked.accumulation_steps,
                "plan_explained": checked.explain(),
                "probes": [[p.batch, p.outcome, p.peak_bytes] for p in result.probes],
                "peak": memory.resident_peak_bytes() if fit else None,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], fit=sys.argv[2:] != ["search"])
