"""A resume checks its input at every resume point, on JAX: the cases are
tests_common/input_fingerprint.py's."""

from input_fingerprint import *  # noqa: F403
