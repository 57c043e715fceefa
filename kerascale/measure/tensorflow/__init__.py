"""What the TensorFlow backend measures its own way: `timing` (diagnose's
rates, on a `tf.data` pipeline). The JAX backend's counterpart is
`kerascale.measure.jax`."""
