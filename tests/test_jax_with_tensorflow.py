"""Keras's JAX backend where TensorFlow is installed too: what needs
TensorFlow there (a tf.data input, TensorBoard event files) works. The JAX
suite (tests_jax) runs without TensorFlow; this runs a child process on the
JAX backend in the TensorFlow environment, which has jax as well."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xla_flags
from conftest import keras_hub_or_skip

pytest.importorskip("jax")

CHILD = Path(__file__).with_name("jax_with_tf_child.py")


def test_tf_data_checkpoints_and_event_files_on_the_jax_backend(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "jax", "KERASCALE_CACHE_DIR": str(tmp_path)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"  # TensorFlow's warnings, as a user sees them
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["backend"] == "jax"
    # kerascale's tf.data changes apply on JAX too, and train as plain fit.
    assert found["data_changes"]["prefetch"]
    assert found["data_changes"]["autotune_off"]  # and the losses are plain fit's
    np.testing.assert_allclose(found["ours"], found["theirs"][:2], rtol=1e-6)
    # A second fit resumes from the checkpoint (its History carried over)
    # and trains the third epoch as the uninterrupted run did.
    assert found["resumed_epochs"] == [2]
    np.testing.assert_allclose(found["resumed"], found["theirs"], rtol=1e-6)
    assert "state.npz" in found["state_files"]  # Keras's variables, not tf.train
    assert found["event_files"] >= 1  # the monitors' TensorBoard scalars
    # fit(materialize=...) on JAX: the map written once, trained as plain fit.
    assert found["materialized_changes"]["materialized"]
    np.testing.assert_allclose(found["materialized"], found["theirs"], rtol=1e-6)
    assert found["warnings"] == []
    # Steps per call chosen in the run on a shuffled tf.data input (issue
    # 79): measured at one a call, moved (the child lets a move repay
    # itself) and kept or gone back from, plain fit's weights, and the
    # model's own value (1) put back.
    moved = ("steps.run_measured", "steps.run_back")
    assert found["in_run_why"] in moved, found["in_run_why"]
    assert found["in_run_left_at"] == 1
    assert found["in_run_difference"] <= 1e-5, found
    # Keras's JAX fit reads a batch to build the loss and metrics, from an
    # iterator it drops: a cache() kerascale added must not see that read.
    assert "did not fully read the dataset being cached" not in proc.stderr


def test_a_cache_kerascale_adds_sees_no_stray_read_on_two_devices():
    """Keras's JAX fit reads a batch to build the loss and metrics; kerascale
    builds them from the element's spec where it added a cache(), on 2
    devices (data-parallel) as on 1: TensorFlow's warning that the cache
    was not fully read stays away."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    env["XLA_FLAGS"] = xla_flags.forced_devices(2)
    env["KERASCALE_CPU_DEVICES_STAND_IN"] = "1"  # as GPUs: data-parallel
    proc = subprocess.run(
        [sys.executable, str(CHILD.with_name("jax_with_tf_2dev_child.py"))],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["replicas"] == 2 and found["changes"].get("cache"), found
    assert "did not fully read the dataset being cached" not in proc.stderr


def test_a_keras_hub_backbone_is_sharded_with_its_own_layout_map(tmp_path):
    keras_hub_or_skip()  # the child imports it
    env = {**os.environ, "KERAS_BACKEND": "jax", "KERASCALE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("jax_hub_sharding_child.py"))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["strategy"] == "model_parallel", found
    assert found["sharding"]["layouts"] == found["expected"]  # the hub's, resolved
    assert found["expected"]  # the hub splits something here
    assert "GemmaBackbone.get_layout_map" in found["reason"]
    assert np.isfinite(found["loss"]).all()


PROCESSES_CHILD = Path(__file__).parent.parent / "tests_jax" / "processes_child.py"


def _free_ports(n):
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + n < 65536:
            return port


def test_connect_cluster_on_jax_joins_jax_distributed_and_never_starts_tf(tmp_path):
    """README's cluster script on the JAX backend with TensorFlow installed:
    TF_CONFIG describes two processes, and the script calls
    kerascale.connect_cluster(): process 0 after the import joined the
    cluster, process 1 with KERASCALE_AUTO_CONNECT=0, joining it there (one
    cluster checks both ways in). It joins jax.distributed alone:
    TensorFlow's MultiWorkerMirroredStrategy would bind the port JAX's
    coordinator holds, and abort both."""
    port = _free_ports(2)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "XLA_FLAGS")}
    env.update(KERASCALE_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(PROCESSES_CHILD),
                "multi",
                str(port),
                "2",
                str(i),
                str(tmp_path / f"p{i}.json"),
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "CONNECT": connect},
        )
        for i, connect in enumerate(("import", "explicit"))
    ]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    found = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2)]
    for result in found:
        assert result["processes"] == 2
        assert result["connected"] == "DataParallel"
        assert result["tensorflow_started"] is False
        assert result["plan"]["replicas"] == 2
    np.testing.assert_array_equal(found[0]["weights"][0], found[1]["weights"][0])
