"""Steps per call (issue 59) on TensorFlow: the tests of tests_common/steps_per_call.py
(imported, so pytest collects them here), and the conformance cells at 4
steps a call on this lane's backend and device count."""

import pytest
import steps_per_call as cases
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

_CELLS = cases.cells_at_several_steps_a_call("tensorflow", 1)


@pytest.mark.parametrize("cell", _CELLS, ids=[c.id for c in _CELLS])
def test_a_promise_holds_at_four_steps_a_call(cell, tmp_path, monkeypatch):
    cases.promise_holds_at_four_steps_a_call(cell, tmp_path, monkeypatch)


def test_auto_measures_a_tf_data_pipeline_too(monkeypatch):
    """The measurement on a batched `tf.data` pipeline of known length (the
    trials' copy of the pipeline): several steps a call, the weights of
    plain `fit` on the same pipeline."""
    import tensorflow as tf

    cases.always_measure(monkeypatch)
    x, y = cases.data(8192)

    def pipeline():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(cases.BATCH)

    plain = cases.model()
    plain.fit(pipeline(), epochs=2, verbose=0)
    ours = cases.model()
    history = cases.fit(ours, pipeline(), epochs=2)
    plan = history.plan
    assert plan.steps_per_execution > 1, plan.reasons["steps_per_execution"]
    assert ours.steps_per_execution == 1
    difference = cases.largest_difference(cases.weights(ours), cases.weights(plain))
    assert difference <= 1e-5
