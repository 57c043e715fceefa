import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One worker runs this module: its module-scoped fixtures or its cache
# of reference runs are made once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("tests/test_strategy")

HERE = Path(__file__).parent


MODES = ("arrays", "dataset", "accumulate", "accumulate16", "search", "backup")


@pytest.fixture(scope="module")
def results():
    """Every mode of mirrored_child.py, run in one child process (TensorFlow's
    logical devices are set before its runtime starts; one start-up instead
    of six, 30 s of this file's 80): the JSON result of each, by mode."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, str(HERE / "mirrored_child.py"), *MODES],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line[:1] == "{"]
    return {r.pop("mode"): r for r in lines}


@pytest.fixture
def run_child(results):
    def run(mode):
        r = results[mode]
        assert "error" not in r, r["error"]
        return r

    return run


@pytest.mark.parametrize("mode", ["arrays", "dataset"])
def test_mirrored_over_two_logical_cpus_matches_single_device(run_child, mode):
    r = run_child(mode)
    assert r["strategy"] == "mirrored"
    assert r["replicas"] == 2 and len(r["devices"]) == 2
    assert r["single_replicas"] == 1
    assert r["changed"], "training did not move the weights"
    assert r["max_weight_diff"] < 1e-5
    assert r["loss"][0] == pytest.approx(r["loss"][1], abs=1e-5)
    assert r["accuracy"][0] == pytest.approx(r["accuracy"][1], abs=1e-6)


@pytest.mark.parametrize(
    "mode, tolerance", [("accumulate", 1e-5), ("accumulate16", 1e-3)]
)
def test_accumulation_under_mirrored_matches_one_big_batch(run_child, mode, tolerance):
    """Keras's own accumulation fails under a strategy (keras#20582);
    kerascale's fix trains 2 replicas x 2 micro-batches of 8 exactly as one
    device trains batches of 32, also under mixed_float16 loss scaling."""
    r = run_child(mode)
    assert r["strategy"] == "mirrored" and r["replicas"] == 2
    assert r["split"] == [8, 2, 32]
    assert r["changed"], "training did not move the weights"
    assert r["max_weight_diff"] < tolerance


def test_batch_search_under_mirrored_is_per_replica_and_agreed(run_child):
    r = run_child("search")
    assert r["replicas"] == 2
    # max_batch_size=128 is global: 64 per replica, probed on both replicas at once.
    # The result says so unmistakably: batch_size is what fit takes.
    assert r["per_replica_batch_size"] == 64 and r["batch_size"] == 128
    assert (r["precision"], r["strategy"]) == ("float32", "mirrored")
    assert r["largest_probe"] == 64
    assert r["outcomes"] == ["ok"]


def test_fault_tolerant_backup_under_mirrored_resumes_exactly(run_child):
    r = run_child("backup")
    assert r["replicas"] == 2
    # TensorFlow cannot checkpoint a DistributedIterator: the epoch is re-read.
    assert r["stopped_at"] == [0, 3, "replay"]
    assert r["epochs"] == 3 and r["iterations"] == 18
    assert r["max_weight_diff"] <= 1e-6
