"""Steps per call (issue 59) on TensorFlow: the tests of tests_common/steps_per_call.py
(imported, so pytest collects them here), and the conformance cells at 4
steps a call on this lane's backend and device count."""

import pytest
import steps_per_call as cases
from steps_per_call import *  # noqa: F403  (its __all__: collected by pytest here)

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly

test_a_promise_holds_at_four_steps_a_call = cases.promise_test("tensorflow", 1)


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
