"""`kerascale.diagnose` on a memory-bound job, under a real resident-memory
limit in child processes. Apart from test_diagnosis.py, whose timed tests run
alone (`-m serial`): memory is not time, and a neighbour does not change a
child's peak, so this one runs beside others."""

import keras
import numpy as np
import tensorflow as tf

import kerascale

FEATURES = 64


def memory_bound_workload():
    """A wide layer whose activations (64 KiB a sample) dominate its memory:
    batch 2048's step peaks about 250 MiB above batch 64's on CPU, for 13
    GFLOP. (An MLP 1024 -> 2048 -> 2048 -> 1 was used first: on a CPU without
    AVX-512 its step at 2048 stayed under the peak TensorFlow reaches while
    loading the model, so no batch of it was memory-bound.)"""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16384, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse")
    x = np.random.default_rng(0).random((4096, FEATURES), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices((x, x[:, :1]))


def memory_bound_limit(model):
    """A resident-memory limit for this process (where diagnose's fit would
    train: its memory counts) at the peak of batch 2048 of
    `memory_bound_workload`: this process's resident memory and what a
    step at 2048 adds in a child with no limit. Batch 2048 is then at the
    limit on any machine (its probe runs out of memory, or fits with no
    headroom), and small batches fit well under it (the peak of batch 64 is
    checked ~100 MiB lower: children's fixed memory varies by tens of MiB)."""
    from test_batch_search import spec_for

    from kerascale.measure import child
    from kerascale.sense import memory

    x, y = np.zeros((1, FEATURES), "float32"), np.zeros((1, 1), "float32")
    with child.IsolatedProber(model, spec_for(x, y)) as prober:
        small, large = prober(64).peak_bytes, prober(2048).peak_bytes
        base = prober.baseline_bytes()
    assert large - small > 64 << 20, (small, large)
    memory.release_freed()
    return int(memory.resident_bytes() + large - base)


def test_memory_bound_workload_with_a_real_memory_limit():
    """A batch above a real resident-memory limit: the probe in a child
    process does not fit, or peaks within 10% of the limit."""
    model, ds = memory_bound_workload()
    limit = memory_bound_limit(model)
    d = kerascale.diagnose(
        model,
        ds,
        steps=2,
        verbose=0,
        batch_size=2048,
        memory_limit=limit,
        precision="float32",
        # Weighing recomputation would add a search's probes (about 40 s of
        # test time): tests/test_recompute.py and tests_jax/test_remat.py test it.
        recompute=False,
    )
    assert d.bound == "memory"
    assert d.plan.accumulation_steps > 1 or d.memory_headroom < 0.10
    assert any("accumulation" in r.action for r in d.recommendations)
    assert d.to_dict()["bound"] == "memory"
    assert d.plan.reasons["recompute"].code == "recompute.off"
