"""Measurements on the JAX backend: what XLA says before anything runs."""
