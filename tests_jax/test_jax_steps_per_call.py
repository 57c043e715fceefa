"""Steps per call (issue 59) on JAX: the tests of tests_common/steps_per_call.py
(imported, so pytest collects them here), and the conformance cells at 4
steps a call on this lane's backend and device count."""

import conformance
import pytest
import steps_per_call as cases
from conftest import devices
from steps_per_call import *  # noqa: F403  (its __all__: collected by pytest here)

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly

test_a_promise_holds_at_four_steps_a_call = cases.promise_test(
    conformance.this_backend(), devices()
)
