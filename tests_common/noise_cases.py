"""The gradient noise scale's checks that both backends' suites run
(tests/test_goodput.py, tests_jax/test_jax_goodput.py)."""

import keras
import numpy as np

from kerascale.apply import gradient_noise

FEATURES = 8
NOISE = 1.0  # the targets' noise, sigma


def linear_case(samples=32_768, learning_rate=0.01):
    """Linear regression with Keras's MSE, weights at zero: x ~ N(0, I_d),
    y = x.w* + eps, eps ~ N(0, sigma^2), |w*| = 1. A sample's gradient is
    2 (x.d - eps) x with d = w - w* = -w*, so G = 2 d and (Isserlis)
    Sigma = 4 ((|d|^2 + sigma^2) I + d d^T): B_noise = tr(Sigma) / |G|^2 =
    ((|d|^2 + sigma^2) d_features + |d|^2) / |d|^2 = 17."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(FEATURES, 1))
    w /= np.linalg.norm(w)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    y = (x @ w + NOISE * rng.normal(size=(samples, 1))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
        ]
    )
    model.compile(keras.optimizers.SGD(learning_rate), "mse")
    truth = ((1 + NOISE**2) * FEATURES + 1) / 1
    return model, x, y, truth


def measured_noise_scale(model, x, y, small=32, parts=8):
    """B_noise from every sample the data holds: the mean of the |G|^2 and
    tr(Sigma) estimates, then their ratio."""
    sums = [0.0, 0.0]
    count = len(x) // (small * parts)
    for i in range(count):
        start = i * small * parts
        s = gradient_noise.sample(model, x, y, small=small, parts=parts, start=start)
        sums[0] += s.gradient_sq
        sums[1] += s.trace
    return sums[1] / sums[0]


def model_with_state():
    """A model whose training pass moves state beyond its weights: batch
    statistics and a dropout's seed."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(4),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(512, 16)).astype("float32")
    y = rng.integers(0, 4, size=(512,))
    return model, x, y


def trained_weights(measure: bool):
    """Weights after 2 epochs from seed 0, with or without a noise sample
    taken between compile and fit."""
    model, x, y = model_with_state()
    if measure:
        s = gradient_noise.sample(model, x, y, small=16, parts=4)
        assert s.small_sq > s.big_sq > 0, s
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return [np.asarray(v) for v in model.variables]


def callback_run(fit, **fit_kwargs):
    """`fit(model, x, y, callbacks=..., ...)` of the linear case for 3
    epochs with a `NoiseScale` callback: (the callback, the History)."""
    import kerascale

    # A small step: the weights stay far enough from w* for |G| to stand
    # out of the noise of 512 samples.
    model, x, y, truth = linear_case(samples=4096, learning_rate=1e-3)
    noise = kerascale.callbacks.NoiseScale(x, y, small=32, parts=16)
    history = fit(
        model, x, y, epochs=3, batch_size=32, verbose=0, callbacks=[noise], **fit_kwargs
    )
    return noise, history, truth


def check_callback_run(noise, history, truth):
    """A figure an epoch, in History too. Training moves the weights
    toward w*, where |G| falls and B_noise grows past the analytic 17 at
    the zero weights."""
    seen = [e["noise_scale"] for e in noise.epochs_seen]
    assert [e["epoch"] for e in noise.epochs_seen] == [0, 1, 2]
    assert all(s is not None and s > 0 for s in seen), seen
    assert history.history["noise_scale"] == seen
    assert truth < seen[0] < seen[1] < seen[2], (seen, truth)
