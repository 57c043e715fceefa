"""Steps per call (issue 59) on JAX: tests_common/steps_per_call.py."""

import conformance
import pytest
import steps_per_call as cases
from conftest import devices


def test_an_int_trains_like_one_step_a_call_and_is_put_back(tmp_path):
    cases.an_int_trains_like_one_step_a_call_and_is_put_back(tmp_path)


def test_throughput_counts_the_steps_not_the_calls():
    cases.throughput_counts_the_steps_not_the_calls()


def test_a_value_that_does_not_divide_steps_per_epoch_is_said():
    cases.a_value_that_does_not_divide_steps_per_epoch_is_said()


def test_a_value_given_to_compile_is_kept():
    cases.a_value_given_to_compile_is_kept()


def test_auto_measures_and_raises_it_where_nothing_needs_each_step(monkeypatch):
    cases.auto_measures_and_raises_it_where_nothing_needs_each_step(monkeypatch)


def test_a_batch_hook_sees_the_calls_it_sees_in_plain_fit(monkeypatch):
    cases.a_batch_hook_sees_the_calls_it_sees_in_plain_fit(monkeypatch)


def test_a_failed_run_puts_the_value_back():
    cases.a_failed_run_puts_the_value_back()


def test_a_backup_resumes_exactly_at_several_steps_a_call(tmp_path):
    cases.a_backup_resumes_exactly_at_several_steps_a_call(tmp_path)


_CELLS = cases.cells_at_several_steps_a_call(conformance.this_backend(), devices())
_CACHE: dict = {}


@pytest.mark.parametrize("cell", _CELLS, ids=[c.id for c in _CELLS])
def test_a_promise_holds_at_four_steps_a_call(cell, tmp_path, monkeypatch):
    monkeypatch.setenv("KERASCALE_CONFORMANCE_STEPS", "4")
    result = conformance.check(cell, tmp_path, _CACHE)
    assert result == "ok" or result.startswith("dropped"), result
