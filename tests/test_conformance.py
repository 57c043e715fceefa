"""kerascale's promises over the matrix (tests_common/conformance.py): the
pairwise cover's TensorFlow cells here, in-process; its JAX-with-TensorFlow
and two-device cells in a child process each (the backend and the devices
are chosen before they start). tools/conformance_matrix.py runs every cell."""

import os
import subprocess
import sys
from pathlib import Path

import conformance
import pytest
import xla_flags

# One worker runs this module: its module-scoped fixtures or its cache
# of reference runs are made once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("tests/test_conformance")

SCRIPT = Path(conformance.__file__)
HERE = [
    c
    for c in conformance.covered_cells()
    if (c.backend, c.devices) == ("tensorflow", 1)
]


@pytest.mark.nightly
@pytest.mark.parametrize("cell", HERE, ids=[c.id for c in HERE])
def test_promise_holds(cell, tmp_path):
    result = conformance.check(cell, tmp_path, _CACHE)
    assert result == "ok" or result.startswith("dropped"), result


_CACHE: dict = {}


@pytest.mark.parametrize(
    "backend, devices",
    [
        # Not on the next Keras: its TensorFlow cells run in process there,
        # and JAX's 1-device cells in the nightly_jax lane.
        pytest.param("tensorflow", 2, id="tensorflow-2dev"),
        pytest.param("jax", 1, id="jax_with_tf-1dev"),
        pytest.param("jax", 2, id="jax_with_tf-2dev", marks=pytest.mark.nightly),
    ],
)
def test_promises_hold_in_a_child(backend, devices, tmp_path):
    """The pairwise cover's cells of another backend or device count."""
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        KERASCALE_TEST_DEVICES=str(devices),
        KERASCALE_CACHE_DIR=str(tmp_path / "cache"),
        XLA_FLAGS=xla_flags.forced_devices(devices),
    )
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(SCRIPT), "--pairwise"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
    assert rows, proc.stderr[-3000:]
    failed = [row for row in rows if "| FAIL" in row]
    assert proc.returncode == 0 and not failed, "\n".join(failed) or proc.stderr[-3000:]
