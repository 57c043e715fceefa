"""A resume checks its data order instead of trusting it (issue 56), on
TensorFlow: the shared cases are tests_common/resume_order.py's; what this
backend records is this file's."""

from resume_order import *  # noqa: F403
from resume_order import saved_data_record


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
