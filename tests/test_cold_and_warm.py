"""What kerascale measures leaves no trace in training: the case is
tests_common/cold_and_warm.py's."""

from cold_and_warm import *  # noqa: F403
