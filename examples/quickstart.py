"""kerascale quickstart: a small CNN on synthetic images, one changed line.

The model is built the way users build it: float32, outside any strategy
scope. `kerascale.fit` decides the strategy, precision and batch for this
machine, prints the plan, trains, and leaves the trained weights in `model`.

Run: python examples/quickstart.py  (under 2 minutes on 2 CPU cores)
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import kerascale


def make_data(n=2048, seed=0):
    """Images whose class is which quadrant is brightest: learnable, quick."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=n)
    images = rng.uniform(0, 64, size=(n, 32, 32, 3)).astype("uint8")
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 2)
        images[i, r * 16 : (r + 1) * 16, q * 16 : (q + 1) * 16] += 128
    return images, labels


def make_model():
    inputs = keras.Input((32, 32, 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(16, 3, activation="relu", padding="same")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, activation="relu", padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(4, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main():
    import tensorflow as tf  # here: quickstart_jax.py imports this file

    keras.utils.set_random_seed(0)
    images, labels = make_data()
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(2048, seed=0)
    model = make_model()

    history = kerascale.fit(model, ds, epochs=10, verbose=2)  # was: model.fit(ds)

    test_x, test_y = make_data(512, seed=1)
    _, accuracy = model.evaluate(test_x, test_y, verbose=0)  # the user's own model
    print(f"\nplan as JSON: {history.plan.to_json()}")
    print(f"final training loss {history.history['loss'][-1]:.3f}")
    print(f"held-out accuracy of your model after kerascale.fit: {accuracy:.3f}")


if __name__ == "__main__":
    main()
