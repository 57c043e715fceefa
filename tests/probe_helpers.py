"""Layers that batch-size probes in child processes must be able to import
(so they live in a module of their own, not in a test function)."""

import time

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="kerascale_tests")
class Sleep(keras.layers.Layer):
    """Hangs every training step for `seconds`: a probe that never finishes."""

    def __init__(self, seconds=3600.0, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x):
        def nap(t):
            time.sleep(self.seconds)
            return t

        out = tf.py_function(nap, [x], x.dtype)
        out.set_shape(x.shape)
        return out

    def get_config(self):
        return {**super().get_config(), "seconds": self.seconds}


class Broken(keras.layers.Layer):
    """Fails with a bug that has nothing to do with memory (not registered:
    the child imports it by module and name)."""

    def call(self, x, training=None):
        if training:
            raise ValueError("a bug in the model, not a memory problem")
        return x


def small_convnet(side=32):
    inputs = keras.Input((side, side, 3))
    h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model
