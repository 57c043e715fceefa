"""What the JAX backend does to carry out a plan: `keras.distribution`
instead of `tf.distribute`, and no TensorFlow anywhere on the way."""
