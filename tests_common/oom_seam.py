"""The deterministic out-of-memory seam on TensorFlow: a layer that, above a
batch of `limit` samples, asks TensorFlow's CPU allocator for 2**62 floats
(2**64 bytes). The allocator refuses it at once with a real
ResourceExhaustedError, the error a GPU out of memory raises. (A request of
TBs or PBs made it wait 10 s for memory to come free before refusing.)"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="kerascale_tests")
class OutOfMemoryAbove(keras.layers.Layer):
    def __init__(self, limit=64, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    def call(self, x):
        rows = tf.where(tf.shape(x)[0] > self.limit, tf.constant(2**62, tf.int64), 1)
        huge = tf.random.uniform(tf.stack([rows, tf.constant(1, tf.int64)]))
        return x + tf.cast(0.0 * tf.reduce_min(huge), x.dtype)

    def get_config(self):
        return {**super().get_config(), "limit": self.limit}
