"""Steps per call (issue 59) on JAX: the tests of tests_common/steps_per_call.py
(imported, so pytest collects them here), and the conformance cells at 4
steps a call on this lane's backend and device count."""

import conformance
import pytest
import steps_per_call as cases
from conftest import devices
from steps_per_call import (  # noqa: F401  (collected by pytest here)
    test_a_backup_resumes_exactly_at_several_steps_a_call,
    test_a_batch_hook_sees_the_calls_it_sees_in_plain_fit,
    test_a_failed_run_puts_the_value_back,
    test_a_value_given_to_compile_is_kept,
    test_a_value_that_does_not_divide_steps_per_epoch_is_said,
    test_an_int_trains_like_one_step_a_call_and_is_put_back,
    test_auto_measures_and_raises_it_where_nothing_needs_each_step,
    test_throughput_counts_the_steps_not_the_calls,
)

_CELLS = cases.cells_at_several_steps_a_call(conformance.this_backend(), devices())


@pytest.mark.parametrize("cell", _CELLS, ids=[c.id for c in _CELLS])
def test_a_promise_holds_at_four_steps_a_call(cell, tmp_path, monkeypatch):
    cases.promise_holds_at_four_steps_a_call(cell, tmp_path, monkeypatch)
