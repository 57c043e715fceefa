"""Run by test_jax_with_tensorflow.py: Keras's JAX backend in a process that
has TensorFlow installed, for what needs it there (a tf.data input,
TensorBoard event files). Prints one JSON line of findings."""

import json
import os
import sys
import warnings

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import kerascale
from kerascale.apply import steps_in_run
from kerascale.plan import reasons


def model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    out = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))
    out.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return out


def main(directory):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")

    def data():
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .map(lambda a, b: (a * 2.0, b))
            .batch(32)
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = kerascale.fit(
            model(),
            data(),
            epochs=2,
            verbose=0,
            checkpoint_dir=os.path.join(directory, "ckpt"),
            log_dir=os.path.join(directory, "logs"),
        )
        trained = []
        resumed = kerascale.fit(
            model(),
            data(),
            epochs=3,
            verbose=0,
            checkpoint_dir=os.path.join(directory, "ckpt"),
            callbacks=[
                keras.callbacks.LambdaCallback(
                    on_epoch_begin=lambda epoch, logs: trained.append(epoch)
                )
            ],
        )
        materialized = kerascale.fit(
            model(),
            data(),
            epochs=3,
            verbose=0,
            materialize=os.path.join(directory, "shards"),
        )
    theirs = model().fit(data(), epochs=3, verbose=0)
    in_run = steps_in_the_run()
    events = [
        os.path.join(root, name)
        for root, _, names in os.walk(os.path.join(directory, "logs"))
        for name in names
        if name.startswith("events.out.tfevents")
    ]
    said = [
        str(w.message)
        for w in caught
        if issubclass(w.category, kerascale.KerascaleWarning)
    ]
    print(
        json.dumps(
            {
                "backend": ours.plan.backend,
                "data_changes": ours.plan.data_changes.to_dict(),
                "ours": ours.history["loss"],
                "resumed": resumed.history["loss"],
                "resumed_epochs": trained,
                "theirs": theirs.history["loss"],
                "materialized": materialized.history["loss"],
                "materialized_changes": materialized.plan.data_changes.to_dict(),
                "event_files": len(events),
                "state_files": sorted(
                    name
                    for _, _, names in os.walk(os.path.join(directory, "ckpt"))
                    for name in names
                ),
                "warnings": said,
                **in_run,
            }
        )
    )


def steps_in_the_run():
    """Steps per call chosen in the run (issue 79) on a shuffled tf.data
    input: 128 steps an epoch, 3 epochs; the weights against plain fit's."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4096, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")

    def data():
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=2).batch(32)

    steps_in_run.REPAY = 0.0  # a move repays itself: the run here is short
    plain = model()
    keras.utils.set_random_seed(5)
    plain.fit(data(), epochs=3, verbose=0)
    ours = model()
    keras.utils.set_random_seed(5)
    history = kerascale.fit(ours, data(), epochs=3, verbose=0)
    why = history.plan.reasons["steps_per_execution"]
    return {
        "in_run_steps": history.plan.steps_per_execution,
        "in_run_why": reasons.code(why),
        "in_run_left_at": ours.steps_per_execution,
        "in_run_difference": max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(plain.get_weights(), ours.get_weights(), strict=True)
        ),
    }


if __name__ == "__main__":
    main(sys.argv[1])
