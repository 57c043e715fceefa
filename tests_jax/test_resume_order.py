"""A resume checks its data order instead of trusting it (issue 56), on JAX:
the shared cases are tests_common/resume_order.py's; what this backend
records is this file's."""

import pytest
from resume_order import *  # noqa: F403
from resume_order import (
    ORDER,
    carried_at_each_epoch,
    interrupted_then_resumed,
    saved_data_record,
)

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly


@pytest.mark.once
@pytest.mark.parametrize("kind", ["arrays", "pydataset", "pydataset_workers"])
def test_every_input_read_again_records_its_last_batch(kind, tmp_path):
    """On JAX, Keras iterates every input in Python: each is read again to
    its place on resume, and its save records the digest the resume checks."""
    record = saved_data_record(kind, tmp_path)
    assert record["mode"] == "replay" and record["consumed"] == 2, record
    assert len(record["last_batch"]) == 32, record


@pytest.mark.once
def test_keras_carries_the_build_batches_of_a_pydataset_read_by_workers(tmp_path):
    """Pins what `_keras_compat.epoch_order.carried_batches` reads: Keras's
    JAX fit reads a batch to build the model (keras-team/keras#20394), and
    its enqueuer keeps the other 9 it had read for the next epoch
    (keras-team/keras#20123), and so on at every epoch. It is not running
    at the callback's on_epoch_begin: the order is drawn after it."""
    assert carried_at_each_epoch("pydataset_workers", tmp_path) == [(9, False)] * 3


@pytest.mark.once
def test_a_save_within_the_carried_batches_resumes_in_another_order_and_says_why(
    tmp_path,
):
    """The last save at epoch 2's step 2, within the 9 batches the epoch
    carried from epoch 1, which no checkpoint holds: said, with the cause."""
    _, said = interrupted_then_resumed("pydataset_workers", tmp_path)
    ordered = [s for s in said if ORDER in s]
    assert len(ordered) == 1, said
    assert "began the epoch with 9 batches read before it" in ordered[0]
    assert "keras-team/keras#20394" in ordered[0]
