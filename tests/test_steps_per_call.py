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
    """The measurement in the run on a batched `tf.data` pipeline of known
    length (read again each epoch, so a new `fit` at an epoch's end reads
    it as one would): several steps a call, the weights of plain `fit` on
    the same shuffled pipeline."""
    import keras
    import tensorflow as tf

    cases.always_measure(monkeypatch)
    x, y = cases.data(8192)

    def pipeline():
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shuffle(1024, seed=3).batch(cases.BATCH)

    plain = cases.model()
    keras.utils.set_random_seed(1)
    plain.fit(pipeline(), epochs=3, verbose=0)
    ours = cases.model()
    keras.utils.set_random_seed(1)
    history = cases.fit(ours, pipeline(), epochs=3)
    plan = history.plan
    assert plan.steps_per_execution > 1, plan.reasons["steps_per_execution"]
    assert ours.steps_per_execution == 1
    difference = cases.largest_difference(cases.weights(ours), cases.weights(plain))
    assert difference <= 1e-5
