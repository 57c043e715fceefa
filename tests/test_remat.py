"""Recomputation set in place on TensorFlow (`kerascale.apply.remat`: Keras's
remat is `tf.recompute_grad` there): the same training to float noise, and
the model as it was afterwards."""

import keras
import numpy as np
import pytest

from kerascale import _keras_compat as keras_compat
from kerascale.apply import remat


def gelu_mlp(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(64, activation="gelu")(inputs)
    h = keras.layers.Dense(64, activation="gelu")(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(h))
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.parametrize("mode", remat.MODES)
def test_recomputation_trains_as_without_and_is_undone(mode):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 16)).astype("float32"), rng.integers(0, 3, 128)
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = gelu_mlp()
    undo = remat.apply(model, mode)
    assert all(
        keras_compat.remat_mode(layer) is not None for layer in remat.layers_for(model)
    )
    losses = model.fit(x, y, **fit).history["loss"]
    undo()
    assert all(keras_compat.remat_mode(layer) is None for layer in model.layers)
    reference = gelu_mlp()
    np.testing.assert_allclose(
        losses, reference.fit(x, y, **fit).history["loss"], rtol=1e-6
    )
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
