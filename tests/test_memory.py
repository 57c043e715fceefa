"""`memory.planning`: planning's garbage collections walk only what planning
made, and the heap is as it was once the region ends, however it ends."""

import os
import subprocess
import sys
from pathlib import Path


def test_regions_freeze_and_unfreeze_on_a_heap_nobody_froze(tmp_path):
    """tests/memory_regions.py's cases, in a fresh pytest process without the
    suites' conftests (the JAX backend: the cases touch no backend, and it
    starts in a second where TensorFlow takes five)."""
    here = Path(__file__).parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(here / "memory_regions.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]


def test_a_search_in_a_fresh_process_freezes_while_it_plans_and_unfreezes(tmp_path):
    """The region on the real path, where no conftest froze the heap: the
    search's collections run on a frozen heap, and nothing stays frozen."""
    import os
    import subprocess
    import sys

    script = (
        "import gc, numpy as np, keras, kerascale\n"
        "seen = []\n"
        "gc.callbacks.append(lambda phase, info: seen.append(gc.get_freeze_count()))\n"
        "model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])\n"
        "model.compile('adam', 'mse')\n"
        "x, y = np.zeros((512, 8), 'float32'), np.zeros((512, 4), 'float32')\n"
        "found = kerascale.find_batch_size(model, x, y, mode='throughput',\n"
        "                                  precision='float32', verbose=0)\n"
        "print(found.batch_size, max(seen), gc.get_freeze_count())\n"
    )
    env = {
        **os.environ,
        "KERASCALE_CACHE_DIR": str(tmp_path),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    batch, most_frozen, frozen_after = map(int, done.stdout.split()[-3:])
    assert batch >= 1
    assert most_frozen > 100_000  # TensorFlow's and Keras's objects, out of sight
    assert frozen_after == 0
