"""The suite's longest tests, handed out first.

pytest-xdist hands tests (`--dist load`) or files (`--dist loadfile`) to its
two workers in collection order; a long one handed out last keeps one worker
busy while the other has nothing left. Started first, they run beside the
short ones (longest-first scheduling). Measured with `--durations=0` on
2 cores (2026-12-02): the 2-device JAX phase's guide sample (101 s) came
last and took it from 155 s of work a worker to 208 s of wall time.
Names, not times: a test that grows or shrinks is moved here by hand.
"""

LONGEST = (
    # JAX (tests_jax)
    "test_remat.py::test_the_guide_sample_returns_its_bound_under_a_real_limit",
    "test_compiled_search.py::test_found_batch_fits_the_real_limit",
    "test_jax_sharding.py::test_on_four_devices_too",
    "test_jax_processes.py::test_a_model_over_device_memory_is_sharded",
    "test_jax_processes.py::test_a_killed_process_stops_the_other",
    "test_jax_processes.py::test_sigterm_to_one_process",
    "test_jax_fit.py::test_the_jax_guide_s_quickstart_runs_on_two_devices",
    "test_jax_tuner.py::test_a_random_search_over_batch_size_runs_on_jax",
    "test_jax_processes.py::test_a_kill_of_every_process_mid_epoch",
    "test_jax_sharding.py::test_a_sharded_checkpoint_resumes_on_another_mesh",
    # TensorFlow (tests): the files with the longest tests
    "test_batch_search.py::test_real_resident_memory_limit_in_child_processes",
    "test_strategy.py::",
    "test_diagnosis_memory.py::test_memory_bound_workload_with_a_real_memory_limit",
    "test_conformance.py::test_promises_hold_in_a_child",
    "test_backup.py::test_sigkill_mid_epoch_three_resumes_to_identical_weights",
    "test_jax_with_tensorflow.py::test_connect_cluster_on_jax_joins_jax_distributed",
    "test_dropin.py::test_a_partial_builder_trains",
    # TensorFlow's real clusters (`-m cluster`, two at a time)
    "test_multiworker.py::test_a_killed_worker_stops_the_other",
    "test_multiworker.py::test_sigterm_to_one_worker",
    "test_multiworker.py::test_time_decisions_are_taken_at_one_step",
    "test_multiworker.py::test_two_workers_fit_like_one_process",
    "test_multiworker.py::test_a_frozen_worker_is_lost",
    "test_lease.py::test_a_second_process_on_the_directory_stops",
)


def longest_first(items: list) -> None:
    """Moves the `LONGEST` tests to the front, in its order; the rest keep
    theirs."""

    def rank(item) -> int:
        return next(
            (i for i, name in enumerate(LONGEST) if name in item.nodeid), len(LONGEST)
        )

    items.sort(key=rank)
