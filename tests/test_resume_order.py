"""A resume checks its data order instead of trusting it (issue 56), on
TensorFlow: the shared cases are tests_common/resume_order.py's; what this
backend records is this file's."""

import pytest
from resume_order import *  # noqa: F403
from resume_order import (
    ORDER,
    carried_at_each_epoch,
    data,
    interrupted_then_resumed,
    run,
    same_weights,
    saved_data_record,
)

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly


def test_a_pydataset_save_records_its_last_batch_and_arrays_their_iterator(tmp_path):
    """On TensorFlow a PyDataset is read again to its place, and its save
    records the digest the resume checks (seen in Keras's adapter); arrays
    resume from tf.data's iterator checkpoint, which holds their order."""
    for kind in ("pydataset", "pydataset_workers"):
        record = saved_data_record(kind, tmp_path / kind)
        assert record["mode"] == "replay" and record["consumed"] == 2, record
        assert len(record["last_batch"]) == 32, record
    arrays = saved_data_record("arrays", tmp_path / "arrays")
    assert arrays["mode"] == "iterator" and "last_batch" not in arrays, arrays


def test_keras_carries_no_batch_of_a_pydataset_read_by_workers(tmp_path):
    """Pins what `_keras_compat.epoch_order.carried_batches` reads: Keras's
    TensorFlow fit reads no batch before its first epoch, so no epoch
    begins with another's batches (on JAX it does, tests_jax's pin). The
    enqueuer is not running at the callback's on_epoch_begin."""
    assert carried_at_each_epoch("pydataset_workers", tmp_path) == [(0, False)] * 3


def test_a_pydataset_read_by_workers_saved_early_in_an_epoch_resumes_exactly(tmp_path):
    """The last save at epoch 2's step 2 (on JAX, within the carried
    batches, which is said)."""
    straight = run("pydataset_workers", tmp_path / "straight", *data())
    resumed, said = interrupted_then_resumed("pydataset_workers", tmp_path / "resumed")
    assert not [s for s in said if ORDER in s], said
    assert same_weights(resumed, straight)
