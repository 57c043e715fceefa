"""A resume checks its input at every resume point, on TensorFlow, and on
JAX beside TensorFlow (its tf.data cells, in a child): the cases are
tests_common/input_fingerprint.py's."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from input_fingerprint import *  # noqa: F403

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.once
def test_jax_beside_tensorflow_checks_its_tf_data_input(tmp_path):
    """JAX iterates a tf.data pipeline in Python: the tf.data cells of
    tests_jax/test_input_fingerprint.py, run with TensorFlow installed."""
    env = dict(os.environ, KERAS_BACKEND="jax", KERASCALE_CACHE_DIR=str(tmp_path))
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-x",
            str(ROOT / "tests_jax" / "test_input_fingerprint.py"), "-k", "tf.data",
        ],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in tail, tail
