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

import os

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


@pytest.mark.once
@pytest.mark.parametrize("kind, limit", cases())
def test_a_cold_cache_and_a_warm_one_train_the_same_weights(
    kind, limit, tmp_path, monkeypatch
):
    monkeypatch.setenv("KERASCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    code = SCRIPT.format(kind=kind, limit=limit)
    runs = [last_json(code, timeout=240) for _ in range(3)]
    cold = runs[0]
    # The first measured, and put its answers in the cache for the others.
    assert os.listdir(tmp_path / "cache")
    reasons = cold["reasons"]
    # the steps per call were timed in the run (moved, or kept where a step
    # timed long: a busy machine), the precision by the trials
    assert "the run" in reasons["steps_per_execution"], reasons
    if cold["bf16"]:  # where the CPU has bf16 math, the trials time it
        assert "measured on your data (trials" in reasons["precision"], reasons
    for warm in runs[1:]:
        for a, b in zip(cold["weights"], warm["weights"], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and as plain `fit` trains (float32, the batch kept, the same updates)
    monkeypatch.setenv("PLAIN", "1")
    plain = last_json(code, timeout=240)
    for a, b in zip(cold["weights"], plain["weights"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
