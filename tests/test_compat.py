"""The Keras 3 + MultiWorkerMirroredStrategy fix: pinned to the upstream code
it replaces, and run by two real worker processes on 127.0.0.1."""

import numpy as np
from test_multiworker import load, max_diff, run_cluster, run_single

from kerascale.apply import keras_compat as compat


def test_upstream_code_is_the_code_the_fix_replaces():
    """Fails when Keras changes the patched functions: revisit kerascale/compat.py
    (and drop it if keras-team/keras#20585 is fixed)."""
    assert compat.upstream_changed() == []


def test_two_workers_train_like_one_process(tmp_path):
    """Plain `model.fit` under a MultiWorkerMirroredStrategy the user made,
    with only the compat fix: as a user who brings their own strategy runs."""
    run_cluster("compat", tmp_path)
    run_single("compat", tmp_path)
    (w0, r0), (w1, r1), (ws, rs) = (
        load(tmp_path, "compat", n) for n in ("w0", "w1", "single")
    )
    assert max_diff(w0, w1) == 0.0  # the workers agree exactly
    assert max_diff(w0, ws) <= 1e-5  # and match one process
    assert r0["history"] == r1["history"]
    np.testing.assert_allclose(r0["history"]["loss"], rs["history"]["loss"], atol=1e-5)
