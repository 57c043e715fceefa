"""kerascale on JAX on a GPU, against the issue's table (one H100, keras
3.15.1): ResNet-50 at 224 through plain `model.fit` and `kerascale.fit`, the
transformer LM's batch search against real steps, and kerascale's
recomputation against XLA's own (on a GPU, XLA rematerializes toward the
device's limit by itself): the LM's bound with and without it, and what the
plan decides for a batch above the bound without it, with its measured
speeds.

    KERAS_BACKEND=jax python benchmarks/jax_gpu.py [--quick]

Needs a GPU and jax[cuda12]; prints one JSON line per row and writes
benchmarks/results/jax_gpu.json. Not yet run by any session (none has had a
GPU): its figures go into README when one is.
"""

import argparse
import datetime
import json
import os
import pathlib
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import keras
import numpy as np

import kerascale
from kerascale.sense.oom import is_oom_exception

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Clock(keras.callbacks.Callback):
    """Images/s over the steps after the first epoch (compiles excluded).
    Async-safe: Keras does not wait on each step's logs for it, as it would
    for a callback that is not (that would time a slower loop)."""

    async_safe = True

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.steps = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        jax.effects_barrier()
        self.seconds = time.perf_counter() - self.start


def resnet(policy="float32"):
    keras.backend.clear_session()
    keras.config.set_dtype_policy(policy)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    keras.config.set_dtype_policy("float32")
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


def resnet_rows(n):
    x = np.random.default_rng(0).random((n, 224, 224, 3), dtype="float32")
    y = np.zeros(n, "int32")
    rows = []
    for name, policy, batch in (
        ("Keras defaults (float32, batch 32)", "float32", 32),
        ("float32, batch 256", "float32", 256),
        ("mixed_bfloat16, batch 256", "mixed_bfloat16", 256),
    ):
        model = resnet(policy)
        clock = Clock()
        model.fit(x, y, batch_size=batch, epochs=2, verbose=0, callbacks=[clock])
        rows.append(
            {"setting": name, "images_per_s": clock.steps * batch / clock.seconds}
        )
    # The host loader alone, on plain fit at the same settings.
    model = resnet("mixed_bfloat16")
    clock = Clock()
    model.fit(
        x,
        y,
        batch_size=256,
        epochs=2,
        verbose=0,
        callbacks=[kerascale.callbacks.Prefetch(), clock],
    )
    rows.append(
        {
            "setting": "mixed_bfloat16, batch 256, + Prefetch()",
            "images_per_s": clock.steps * 256 / clock.seconds,
        }
    )
    # The ceiling: the step alone, on one batch already on the GPU.
    model = resnet("mixed_bfloat16")
    batch_on_gpu = (jax.device_put(x[:256]), jax.device_put(y[:256]))

    def again():
        while True:
            yield batch_on_gpu

    clock = Clock()
    steps = n // 256
    model.fit(again(), steps_per_epoch=steps, epochs=2, verbose=0, callbacks=[clock])
    ceiling = clock.steps * 256 / clock.seconds
    rows.append(
        {"setting": "ceiling: the step alone (bf16, 256)", "images_per_s": ceiling}
    )
    model = resnet()
    clock = Clock()
    history = kerascale.fit(model, x, y, epochs=2, verbose=0, callbacks=[clock])
    batch = history.plan.global_batch_size
    rate = clock.steps * batch / clock.seconds
    rows.append(
        {
            "setting": f"kerascale.fit ({history.plan.precision}, batch {batch})",
            "images_per_s": rate,
            "of_ceiling": rate / ceiling,
        }
    )
    return rows


def lm(seq=512, d=1024, blocks=6, vocab=32000):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, d)(tokens)
    for _ in range(blocks):
        a = keras.layers.MultiHeadAttention(16, d // 16)(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(4 * d, activation="gelu")(h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(d)(f))
    model = keras.Model(tokens, keras.layers.Dense(vocab, dtype="float32")(h))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def lm_rows():
    rows = []
    x = np.zeros((1 << 15, 512), "int32")
    for policy in ("float32", "mixed_bfloat16"):
        keras.backend.clear_session()
        start = time.perf_counter()
        found = kerascale.find_batch_size(lm(), x, x, precision=policy)
        seconds = time.perf_counter() - start

        def runs(batch, policy=policy):
            keras.backend.clear_session()
            keras.config.set_dtype_policy(policy)
            try:
                lm().train_on_batch(x[:batch], x[:batch])
                return True
            except Exception as e:
                if is_oom_exception(e):
                    return False
                raise
            finally:
                keras.config.set_dtype_policy("float32")

        # The truth by real steps, 5% apart, from the batch found.
        low, high = found.batch_size, None
        if runs(low):
            while runs(int(low * 1.05) + 1):
                low = int(low * 1.05) + 1
            high = int(low * 1.05) + 1
        else:
            while not runs(low):
                low, high = int(low * 0.95), low
        rows.append(
            {
                "model": "LM 141M",
                "precision": policy,
                "found": found.batch_size,
                "compiles": len(found.probes),
                "search_seconds": round(seconds, 1),
                "truth_at_least": low,
                "truth_below": high,
                "found_over_truth": round(found.batch_size / low, 3),
            }
        )
    return rows


def remat_rows():
    """The LM in bf16: the bound by XLA's count without kerascale's
    recomputation (XLA's own rematerialization only) and with it, and the
    plan for the batch that fits in one pass only with it."""
    keras.backend.clear_session()
    x = np.zeros((1 << 15, 512), "int32")
    found = kerascale.find_batch_size(lm(), x, x, precision="mixed_bfloat16")
    row = {
        "model": "LM 141M",
        "precision": "mixed_bfloat16",
        "bound_xla_remat_only": found.batch_size,
        "bound_with_kerascale_remat": found.recompute_batch_size,
    }
    if found.recompute_batch_size and found.recompute_batch_size > found.batch_size:
        keras.backend.clear_session()
        plan = kerascale.plan(
            lm(),
            x,
            x,
            batch_size=found.recompute_batch_size,
            precision="mixed_bfloat16",
            verbose=0,
        )
        row.update(
            asked=found.recompute_batch_size,
            recompute=plan.recompute,
            split=[plan.micro_batch_size, plan.accumulation_steps],
            why=plan.reasons.get("recompute", ""),
        )
    return [row]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer images")
    args = parser.parse_args()
    assert jax.devices()[0].platform in ("gpu", "cuda"), "needs a GPU"
    rows = resnet_rows(2560 if args.quick else 10240) + lm_rows() + remat_rows()
    for row in rows:
        print(json.dumps(row), flush=True)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "jax_gpu.json").write_text(
        json.dumps(
            {
                "date": datetime.date.today().isoformat(),
                "device": jax.devices()[0].device_kind,
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
