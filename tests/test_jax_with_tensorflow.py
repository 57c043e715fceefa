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

pytest.importorskip("jax")

CHILD = Path(__file__).with_name("jax_with_tf_child.py")


def test_tf_data_checkpoints_and_event_files_on_the_jax_backend(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "jax", "KERASCALE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["backend"] == "jax"
    # kerascale's tf.data changes apply on JAX too, and train as plain fit.
    assert "prefetch(AUTOTUNE)" in found["data_changes"]
    np.testing.assert_allclose(found["ours"], found["theirs"][:2], rtol=1e-6)
    # A second fit resumes from the checkpoint (its History carried over)
    # and trains the third epoch as the uninterrupted run did.
    assert found["resumed_epochs"] == [2]
    np.testing.assert_allclose(found["resumed"], found["theirs"], rtol=1e-6)
    assert "state.npz" in found["state_files"]  # Keras's variables, not tf.train
    assert found["event_files"] >= 1  # the monitors' TensorBoard scalars
    # fit(materialize=...) on JAX: the map written once, trained as plain fit.
    assert found["materialized_changes"][0] == "materialized"
    np.testing.assert_allclose(found["materialized"], found["theirs"], rtol=1e-6)
    assert found["warnings"] == []


def test_a_keras_hub_backbone_is_sharded_with_its_own_layout_map(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "jax", "KERASCALE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("jax_hub_sharding_child.py"))],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["strategy"] == "model_parallel", found
    assert found["sharding"]["layouts"] == found["expected"]  # the hub's, resolved
    assert found["expected"]  # the hub splits something here
    assert "GemmaBackbone.get_layout_map" in found["reason"]
    assert np.isfinite(found["loss"]).all()
