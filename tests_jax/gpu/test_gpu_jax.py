"""kerascale on JAX on a real GPU: run on a machine with one
(`.venv-jax/bin/python -m pytest tests_jax/gpu`, jax[cuda12] installed);
skipped elsewhere. What only a GPU exercises: the device's own memory figures
(`memory_stats`), a real out-of-memory as JAX raises it, bf16 chosen by
compute capability, and the compile reused by training."""

import time

import jax
import keras
import numpy as np
import pytest

import kerascale
from kerascale.sense.oom import is_oom_exception

pytestmark = pytest.mark.skipif(
    jax.devices()[0].platform not in ("gpu", "cuda", "rocm"), reason="needs a GPU"
)


def _lm(seq=256, d=512, blocks=4, vocab=8000):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, d)(tokens)
    for _ in range(blocks):
        a = keras.layers.MultiHeadAttention(8, d // 8)(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(4 * d, activation="gelu")(h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(d)(f))
    logits = keras.layers.Dense(vocab, dtype="float32")(h)
    model = keras.Model(tokens, logits)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _runs(batch, seq=256, vocab=8000):
    """Whether one real step at `batch` runs on a fresh model."""
    keras.backend.clear_session()
    model = _lm()
    x = np.zeros((batch, seq), "int32")
    try:
        model.train_on_batch(x, x)
        return True
    except Exception as e:
        if is_oom_exception(e):
            return False
        raise


def test_search_on_the_device_fits_and_is_within_a_tenth_of_the_truth():
    x = np.zeros((1 << 16, 256), "int32")
    result = kerascale.find_batch_size(_lm(), x, x, precision="mixed_bfloat16")
    assert len(result.probes) <= 5
    batch = result.per_replica_batch_size
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        assert _runs(batch)
        assert not _runs(int(batch / 0.9) + 1)
    finally:
        keras.config.set_dtype_policy("float32")


def test_fit_plans_bf16_and_training_reuses_the_search_compile():
    x = np.zeros((4096, 256), "int32")
    model = _lm()
    found = kerascale.find_batch_size(model, x, x)
    compile_seconds = max(p.seconds for p in found.probes)
    started = {}

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            started.setdefault("t", time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            started.setdefault("first", time.perf_counter() - started["t"])

    history = kerascale.fit(
        model,
        x,
        x,
        batch_size=found.batch_size,
        epochs=1,
        verbose=0,
        callbacks=[FirstStep()],
    )
    assert history.plan.precision == "mixed_bfloat16"
    assert history.plan.backend == "jax"
    # The first step reads its program from JAX's cache: well under a compile.
    assert started["first"] < 0.5 * compile_seconds, (started, compile_seconds)


def test_recomputation_against_xlas_own_on_the_device():
    """On a GPU XLA rematerializes toward the device's limit by itself: the
    bound with kerascale's recomputation is measured against that one (not
    against none), and a real step at it runs with recomputation on."""
    from kerascale.apply import remat

    x = np.zeros((1 << 16, 256), "int32")
    found = kerascale.find_batch_size(_lm(), x, x, precision="mixed_bfloat16")
    assert found.recompute_batch_size is not None
    assert found.recompute_batch_size >= found.batch_size
    print(f"bound: {found.batch_size} XLA's own, {found.recompute_batch_size} with")
    keras.backend.clear_session()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = _lm()
        remat.apply(model)
        batch = x[: found.recompute_batch_size]
        model.train_on_batch(batch, batch)  # a real OOM here fails the test
    finally:
        keras.config.set_dtype_policy("float32")
