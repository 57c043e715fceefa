"""Run by test_jax_with_tensorflow.py on 2 JAX devices: a tf.data map that
kerascale caches, trained data-parallel; prints the plan's replicas and data
changes as JSON."""

import json
import os

os.environ["KERAS_BACKEND"] = "jax"
import keras
import numpy as np
import tensorflow as tf

import kerascale

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b)).batch(32)
inputs = keras.Input((4,))
m = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
m.compile(
    optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
)
h = kerascale.fit(m, ds, epochs=2, verbose=0)
print(
    json.dumps({"replicas": h.plan.replicas, "changes": h.plan.data_changes.to_dict()})
)
