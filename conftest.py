"""The repository's root conftest: pytest loads it for both test suites
(tests/ with TensorFlow, tests_jax/ without it), as the parent of each. It
imports nothing heavy, and no test module or child process imports it."""

import gc


def pytest_collection_finish(session):
    """What the imports made (TensorFlow's, Keras's, JAX's modules) is moved
    out of the garbage collector's sight once the tests are collected, so
    that the full collection `clear_session` runs before each test walks
    only what tests made: 1 ms instead of 0.3-0.5 s a test.

    Each suite's `_fresh_keras` freezes again, after that collection, what
    outlived the test before: what a worker keeps grows with its tests (a
    `fit` on a tf.data input leaves 121 graph operations alive, plain
    `model.fit` as much), and its collections came to take 0.24 s a test
    (241 s of the TensorFlow lane's setups, 2026-11-29; 18 s since). What
    was alive then and dies later (a module fixture's model) stays frozen
    until the worker exits; unfreezing would free it all at once (77 s once),
    so the cases that need a heap nobody froze run in a process of their own
    (tests/memory_regions.py)."""
    gc.collect()
    gc.freeze()


# The lanes' plugin (tests_common, on pytest's pythonpath): the order tests are
# handed out in and the quick lane's selection, from recorded durations.
pytest_plugins = ["lanes"]
