"""What kerascale measures leaves no trace in training (issue 80): one script
run three times in fresh processes that share one cache. The first measures
(the CPU trials and the steps per call in the run, every budget set to pay
however short the run; and in a second case a batch check against
`memory_limit`); the next two read
its answers from the cache. All three end on the same weights, on a
shuffled input (arrays, and on TensorFlow a seeded `tf.data` pipeline) with
Dropout drawing from Keras's seed generator. The trials' copies train for
real, but their timings are fixed (float32 the faster), so that every run
takes the same decision: a verdict within the noise would be measured again
by the next run, and could differ.
tests/test_cold_and_warm.py and tests_jax/test_cold_and_warm.py run it."""

import keras
import numpy as np
import pytest
from fresh_process import last_json

SCRIPT = """
import json, os, sys
import keras, numpy as np
import kerascale
import kerascale.sense.hardware
from kerascale.apply import steps_in_run
from kerascale.measure import budget
from kerascale.measure import trial_bench
budget.REPAY = 0.0  # every measurement pays, however short the run
steps_in_run.REPAY = 0.0
real_timed = trial_bench.Bench._timed


def timed(self, key):  # the copies train for real; the verdict is fixed
    real_timed(self, key)
    return 1000.0 if key[1] == "float32" else 500.0


trial_bench.Bench._timed = timed
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(640, 8)).astype("float32")
y = (x[:, :2].sum(axis=1) > 0).astype("int64")
model = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dropout(0.3),
    keras.layers.Dense(2),
])
model.compile(
    keras.optimizers.Adam(1e-2),
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
if {kind!r} == "tf.data":
    import tensorflow as tf
    args = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(640, seed=1).batch(16),)
    kwargs = {{}}
else:
    args, kwargs = (x, y), {{"batch_size": 16, "shuffle": True}}
if os.environ.get("PLAIN") == "1":  # what measuring nothing trains
    model.fit(*args, epochs=4, verbose=0, **kwargs)
    print(json.dumps({{"weights": [w.tolist() for w in model.get_weights()]}}))
    sys.exit(0)
history = kerascale.fit(model, *args, epochs=4, verbose=0, **{limit}, **kwargs)
plan = history.plan
print(json.dumps({{
    "weights": [w.tolist() for w in model.get_weights()],
    "reasons": {{k: str(v) for k, v in plan.reasons.items()}},
    "steps_per_execution": plan.steps_per_execution,
    "bf16": kerascale.sense.hardware.detect_hardware().cpu.bf16,
}}))
"""


TRIALS, CHECK = "{}", '{"memory_limit": "4GiB"}'


def cases():
    """(input, what the first run measures besides the trials and the steps
    per call). On JAX the batch check compiles the training step on your
    model, for training to reuse, which builds its loss and metrics: Keras's
    `fit` then skips the batch it reads to build them, whose iterator drew
    the first epoch's order, and kerascale reads it instead
    (`_keras_compat.ReadToBuild`). On TensorFlow the check runs beside the
    tf.data input, whose shuffle seeds a measurement must not draw."""
    if keras.backend.backend() == "tensorflow":
        pairs = [("arrays", TRIALS, "arrays"), ("tf.data", CHECK, "tf.data-check")]
    else:
        pairs = [("arrays", TRIALS, "arrays"), ("arrays", CHECK, "arrays-check")]
    return [pytest.param(kind, limit, id=name) for kind, limit, name in pairs]


def trained(kind, limit, tmp_path, monkeypatch):
    """The script's three runs on one cache (the first from an empty one),
    then plain `fit`'s run: ([cold, warm, warm], plain), each its JSON."""
    monkeypatch.setenv("KERASCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    code = SCRIPT.format(kind=kind, limit=limit)
    runs = [last_json(code, timeout=240) for _ in range(3)]
    monkeypatch.setenv("PLAIN", "1")
    return runs, last_json(code, timeout=240)


def unmeasured(cold):
    """What the first run should have measured and did not: the steps per
    call in the run (moved, or kept where a step timed long: a busy
    machine), the precision by the trials where the CPU has bf16 math."""
    reasons = cold["reasons"]
    missing = []
    if "the run" not in reasons["steps_per_execution"]:
        missing.append("steps_per_execution")
    if cold["bf16"] and "measured on your data (trials" not in reasons["precision"]:
        missing.append("precision")
    return missing


def same(a, b, exact=True):
    """Whether two runs ended on the same weights (`exact`: bit for bit,
    else within float32 round-off of the same updates)."""
    pairs = [
        (np.asarray(u), np.asarray(v))
        for u, v in zip(a["weights"], b["weights"], strict=True)
    ]
    if exact:
        return all(np.array_equal(u, v) for u, v in pairs)
    return all(np.allclose(u, v, rtol=1e-5, atol=1e-6) for u, v in pairs)
