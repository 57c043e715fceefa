"""A resume checks its data order instead of trusting it (issue 56), on JAX:
the shared cases are tests_common/resume_order.py's; what this backend
records is this file's."""

import pytest
from resume_order import *  # noqa: F403
from resume_order import saved_data_record


@pytest.mark.once
@pytest.mark.parametrize("kind", ["arrays", "pydataset", "pydataset_workers"])
def test_every_input_read_again_records_its_last_batch(kind, tmp_path):
    """On JAX, Keras iterates every input in Python: each is read again to
    its place on resume, and its save records the digest the resume checks."""
    record = saved_data_record(kind, tmp_path)
    assert record["mode"] == "replay" and record["consumed"] == 2, record
    assert len(record["last_batch"]) == 32, record
