"""kerascale on Keras's JAX backend, without TensorFlow: the quickstart's CNN on
NumPy arrays, with a memory limit that the batch search reads from the
compiler. Two CPU devices are made visible: they share this machine's cores,
so kerascale trains on one of them, as `model.fit` does, and its plan says why
(on two GPUs it would split each batch over them).

Run (the JAX environment from README):

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        .venv-jax/bin/python examples/quickstart_jax.py
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
from quickstart import make_data, make_model

import kerascale


def main():
    keras.utils.set_random_seed(0)
    images, labels = make_data()
    model = make_model()

    # was: model.fit(images, labels, epochs=5); memory_limit bounds the batch
    history = kerascale.fit(
        model, images, labels, epochs=5, memory_limit="1GiB", verbose=2
    )

    test_x, test_y = make_data(512, seed=1)
    _, accuracy = model.evaluate(test_x, test_y, verbose=0)  # your own model
    print(
        f"\nbackend {history.plan.backend}, strategy {history.plan.strategy}, "
        f"batch {history.plan.global_batch_size}"
    )
    print(f"test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
