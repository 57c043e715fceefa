"""kerascale's promises over the matrix (tests_common/conformance.py): the
pairwise cover's cells of JAX without TensorFlow, on this suite's device
count (README runs it on 1 and on 2)."""

import conformance
import pytest
from conftest import devices

# Also run on the next Keras (the nightly lanes).
# One worker runs this module: its module-scoped fixtures or its cache
# of reference runs are made once (`--dist loadgroup`).
pytestmark = [
    pytest.mark.nightly,
    pytest.mark.xdist_group("tests_jax/test_conformance"),
]

HERE = [
    c
    for c in conformance.covered_cells()
    if (c.backend, c.devices) == ("jax", devices())
]
_CACHE: dict = {}


@pytest.mark.parametrize("cell", HERE, ids=[c.id for c in HERE])
def test_promise_holds(cell, tmp_path):
    result = conformance.check(cell, tmp_path, _CACHE)
    assert result == "ok" or result.startswith("dropped"), result
