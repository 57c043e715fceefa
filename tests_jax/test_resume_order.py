"""A resume checks its data order instead of trusting it (issue 56), on JAX:
the cases are tests_common/resume_order.py's."""

from resume_order import *  # noqa: F403
