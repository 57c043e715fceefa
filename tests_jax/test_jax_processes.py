"""Several JAX processes on 127.0.0.1 (gloo), joined by `import kerascale`
with no line of the script's own: they train as one process on the global
batch does, though each built its model from a seed of its own."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import devices

from kerascale.callbacks import checkpoint_store as store
from kerascale.sense import jax_processes

# The tests that compare with `straight`'s runs share one worker, which makes
# them once (`--dist loadgroup`).
STRAIGHT = pytest.mark.xdist_group("tests_jax/test_jax_processes::straight")

CHILD = Path(__file__).with_name("processes_child.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(mode, count, tmp_path, *extra, env_extra=None):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "XLA_FLAGS")}
    env.update(env_extra or {})
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                mode,
                str(port),
                str(count),
                str(i),
                str(tmp_path / f"{mode}{i}.json"),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(count if mode != "single" else 1)
    ]


# The children clear XLA_FLAGS: the same on any device count of the suite.
several_processes = pytest.mark.skipif(
    devices() > 1, reason="the children are alike on any device count: run once"
)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 2-process run of 4 epochs, which the resumes match."""
    return _run("multi", 2, tmp_path_factory.mktemp("straight"), "4")[0]


def _run(mode, count, tmp_path, *extra, env_extra=None):
    return _finish(
        mode, tmp_path, _start(mode, count, tmp_path, *extra, env_extra=env_extra)
    )


def _finish(mode, tmp_path, procs):
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    return [
        json.loads((tmp_path / f"{mode}{i}.json").read_text())
        for i in range(len(procs))
    ]


def _run_beside_single(tmp_path, *extra, env_extra=None, single_env=None):
    """The 2-process run and its one-process reference at once (each
    writes its own files): (first, second, alone)."""
    multi = _start("multi", 2, tmp_path, *extra, env_extra=env_extra)
    single = _start("single", 2, tmp_path, *extra, env_extra=single_env)
    try:
        both = _finish("multi", tmp_path, multi)
    except BaseException:
        for p in single:
            p.kill()
            p.wait()
        raise
    return (*both, *_finish("single", tmp_path, single))


@several_processes
def test_two_processes_train_as_one_process_on_the_global_batch(tmp_path):
    first, second, alone = _run_beside_single(tmp_path)
    assert first["processes"] == second["processes"] == 2
    plan = first["plan"]
    assert plan["strategy"] == "data_parallel" and plan["replicas"] == 2
    assert plan["global_batch_size"] == 16  # Keras's batch_size: the global batch
    assert "2 JAX processes" in plan["reason"]
    assert plan["data_changes"]["by_process"]
    # both processes end alike, and as one process on the global batch does
    np.testing.assert_allclose(first["loss"], alone["loss"], rtol=1e-5)
    np.testing.assert_allclose(second["loss"], first["loss"], rtol=0, atol=0)
    for a, b, c in zip(
        first["weights"], second["weights"], alone["weights"], strict=True
    ):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    # and the model is the user's again: no distribution set, it predicts alone
    assert first["distribution_after"] == "None" and first["predicts"]


@several_processes
@pytest.mark.parametrize(
    "kind, epochs", [("pydataset", "3"), ("generator", "1"), ("grain", "3")]
)
def test_a_pydataset_generator_or_grain_across_two_processes_trains_as_one_process(
    tmp_path, kind, epochs
):
    """Each process reads every global batch of a PyDataset (a generator, a
    grain dataset) and trains on its block: the weights of one process on
    the arrays' global batches."""
    first, second, alone = _run_beside_single(
        tmp_path, epochs, env_extra={"INPUT": kind}
    )
    assert first["plan"]["replicas"] == 2
    changes = first["plan"]["data_changes"]
    assert changes["by_process"]
    np.testing.assert_allclose(first["loss"], alone["loss"], rtol=1e-5)
    for a, b, c in zip(
        first["weights"], second["weights"], alone["weights"], strict=True
    ):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


@several_processes
@STRAIGHT
def test_sigterm_to_one_process_saves_on_all_at_one_step_and_exits_143(
    tmp_path, straight
):
    checkpoints = tmp_path / "checkpoints"
    procs = _start(
        "multi", 2, tmp_path, "4", str(checkpoints), env_extra={"STEP_SLEEP": "0.2"}
    )
    deadline = time.monotonic() + 120
    while not (checkpoints / "ckpt-00000001").exists():  # past the first epoch
        assert time.monotonic() < deadline, procs[0].communicate()[0][-3000:]
        assert all(p.poll() is None for p in procs)
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGTERM)  # preemption reaches one VM
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], [o[-2000:] for o in outs]
    saved = sorted(p.name for p in checkpoints.iterdir())
    assert len(saved) >= 2, saved  # the epoch's, and the preemption's mid-epoch
    # process 0 alone writes there, and numbers its saves one after another
    first = int(saved[0].split("-")[1])
    assert saved == [f"ckpt-{n:08d}" for n in range(first, first + len(saved))]
    # The rerun resumes where both stopped and ends as an uninterrupted run.
    resumed, _ = _run("multi", 2, tmp_path, "4", str(checkpoints))
    assert resumed["epochs_begun"][0] >= 1  # it resumed, past the first epoch
    np.testing.assert_array_equal(resumed["loss"], straight["loss"])
    for a, b in zip(resumed["weights"], straight["weights"], strict=True):
        np.testing.assert_array_equal(a, b)


@several_processes
def test_a_model_over_device_memory_is_sharded_across_two_processes(tmp_path):
    """2 processes of 2 CPU devices each: a replica needs ~20 MiB, over 12 MiB
    a device, so the plan shards over the 4 devices of both processes (not
    timed: each process would time its own; the smallest model axis that
    fits), and it trains as one process on one device does."""
    wide = {"WIDE": "1"}
    env = {**wide, "LOCAL_DEVICES": "2", "DEVICE_MEMORY": "12MiB"}
    first, second, alone = _run_beside_single(
        tmp_path, "2", env_extra=env, single_env=wide
    )
    plan = first["plan"]
    assert plan["strategy"] == "model_parallel", plan
    assert plan["sharding"]["mesh"] == [2, 2]  # the smallest model axis
    assert plan["sharding"]["bytes"]["sharded"] <= 12 << 20
    assert plan["sharding"]["bytes"]["replicated"] > 12 << 20
    assert "not timed: each of several processes" in plan["sharding_reason"]
    assert "4 devices of 2 processes" in plan["reason"]
    np.testing.assert_allclose(first["loss"], alone["loss"], rtol=1e-5)
    for a, b, c in zip(
        first["weights"], second["weights"], alone["weights"], strict=True
    ):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def straight_shuffled(tmp_path_factory):
    """As `straight`, with fit's shuffle=True."""
    path = tmp_path_factory.mktemp("straight_shuffled")
    return _run("multi", 2, path, "4", env_extra={"SHUFFLE": "1"})[0]


@several_processes
@STRAIGHT
def test_a_kill_of_every_process_mid_epoch_resumes_bit_identical(
    tmp_path, straight, straight_shuffled
):
    """Shuffled: each process shuffles its own share with its own random
    state, so the checkpoint holds every process's, and each puts its own
    back (only process 0's, and process 1 would shuffle as process 0 did)."""
    assert straight_shuffled["loss"] != straight["loss"]  # it does shuffle
    checkpoints = tmp_path / "checkpoints"
    slow = {"STEP_SLEEP": "0.2", "SAVE_FREQ": "2", "SHUFFLE": "1"}
    procs = _start("multi", 2, tmp_path, "4", str(checkpoints), env_extra=slow)
    deadline = time.monotonic() + 120
    while not (checkpoints / "ckpt-00000005").exists():  # mid-epoch 2 (7 steps)
        assert time.monotonic() < deadline, procs[0].communicate()[0][-3000:]
        assert all(p.poll() is None for p in procs)
        time.sleep(0.05)
    for p in procs:
        p.kill()  # SIGKILL: no handler runs
    for p in procs:
        p.wait(timeout=60)
    _, meta = next(store.verified(store.scan(str(checkpoints))))  # the newest
    assert len(meta["random_by_worker"]) == 2  # every process's own
    resumed, other = _run(
        "multi", 2, tmp_path, "4", str(checkpoints), env_extra={"SHUFFLE": "1"}
    )
    assert resumed["epochs_begun"] == other["epochs_begun"] == [1, 2, 3]  # resumed
    np.testing.assert_array_equal(resumed["loss"], straight_shuffled["loss"])
    weights = zip(
        resumed["weights"], other["weights"], straight_shuffled["weights"], strict=True
    )
    for a, b, c in weights:
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@several_processes
@STRAIGHT
def test_a_killed_process_stops_the_other_within_worker_timeout_and_a_restart_resumes(
    tmp_path, straight
):
    """JAX's coordination service finds the lost process by its heartbeats
    (`KERASCALE_WORKER_TIMEOUT`) and ends the other with its own message
    (an abort, exit -6: no Python hook runs there, README); the restart
    resumes from the last committed checkpoint and ends as a straight run."""
    checkpoints = tmp_path / "checkpoints"
    env = {"STEP_SLEEP": "0.2", "KERASCALE_WORKER_TIMEOUT": "6"}
    procs = _start("multi", 2, tmp_path, "4", str(checkpoints), env_extra=env)
    deadline = time.monotonic() + 120
    while not (checkpoints / "ckpt-00000001").exists():  # past the first epoch
        assert time.monotonic() < deadline, procs[0].communicate()[0][-3000:]
        assert all(p.poll() is None for p in procs)
        time.sleep(0.1)
    procs[1].kill()  # SIGKILL: process 1 says nothing
    killed = time.monotonic()
    out = procs[0].communicate(timeout=120)[0]
    took = time.monotonic() - killed
    assert procs[0].returncode != 0, out[-2000:]
    assert took < 6 + 15, took  # the heartbeat timeout, and a poll's delay
    assert "heartbeat timeout" in out and "another task died" in out, out[-2000:]
    resumed, _ = _run("multi", 2, tmp_path, "4", str(checkpoints))
    assert resumed["epochs_begun"][0] >= 1  # it resumed, past the first epoch
    np.testing.assert_array_equal(resumed["loss"], straight["loss"])
    for a, b in zip(resumed["weights"], straight["weights"], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {
                "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
                "JAX_NUM_PROCESSES": "4",
                "JAX_PROCESS_ID": "2",
            },
            ("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234", 4, 2),
        ),
        (
            {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:1234,10.0.0.2:2345",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                "KERAS_DISTRIBUTION_PROCESS_ID": "1",
            },
            ("KERAS_DISTRIBUTION", "10.0.0.1:1234", 2, 1),
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {
                            "chief": ["h0:2222"],
                            "worker": ["h1:2222", "h2:2222"],
                        },
                        "task": {"type": "worker", "index": 1},
                    }
                )
            },
            ("TF_CONFIG", "h0:2222", 3, 2),
        ),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {
                        "cluster": {
                            "workerpool0": ["h0:2222"],
                            "workerpool1": ["h1:2222"],
                        },
                        "task": {"type": "workerpool1", "index": 0},
                    }
                )
            },
            ("CLUSTER_SPEC", "h0:2222", 2, 1),
        ),
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_NODELIST": "n[1-2]",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_PROCID": "1",
            },
            ("SLURM", None, 2, 1),
        ),
    ],
)
def test_the_processes_are_read_from_the_same_sources_as_tensorflow_s(env, expected):
    found = jax_processes.describe(env)
    assert (found.source, found.coordinator, found.num_processes, found.process_id) == (
        expected
    )
    assert found.several and not found.error


@pytest.mark.parametrize(
    "env, says",
    [
        ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2x"}, "whole"),
        (
            {
                "JAX_COORDINATOR_ADDRESS": "h:1",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": "2",
            },
            "from 0 to 1",
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"worker": ["h:1"], "ps": ["h:2"]},
                        "task": {"type": "ps", "index": 0},
                    }
                )
            },
            "'ps'",
        ),
        ({"TF_CONFIG": "{not json"}, "not valid JSON"),
    ],
)
def test_a_malformed_description_is_not_joined_and_says_why(env, says):
    found = jax_processes.describe(env)
    assert not found.several and says in found.error


def test_nothing_described_means_nothing_to_join():
    assert jax_processes.describe({}) is None
    assert jax_processes.describe({"SLURM_JOB_ID": "7"}) is None  # not under srun


def test_each_process_restores_its_own_random_state_and_no_other():
    from kerascale.callbacks import _backup_meta as meta_lib

    meta = {
        "random": "chief now",
        "data": {"mode": "replay", "consumed": 3, "random": "chief epoch"},
        "random_by_worker": [
            {"now": "chief now", "epoch": "chief epoch"},
            {"now": "1 now", "epoch": "1 epoch"},
        ],
    }
    mine = meta_lib.for_worker(meta, 1)
    assert mine["random"] == "1 now" and mine["data"]["random"] == "1 epoch"
    assert mine["data"]["consumed"] == 3
    assert meta["data"]["random"] == "chief epoch"  # the read meta is unchanged
    assert meta_lib.for_worker(meta, 0)["random"] == "chief now"
    # written by fewer processes, or by an older kerascale: as written
    assert meta_lib.for_worker(meta, 2) is meta
    assert meta_lib.for_worker({"random": "r", "data": {}}, 1)["random"] == "r"
    # a worker's entry without an epoch state leaves the record's as written
    ended = {**meta, "random_by_worker": [{}, {"now": "1 now", "epoch": None}]}
    mine = meta_lib.for_worker(ended, 1)
    assert mine["random"] == "1 now" and mine["data"]["random"] == "chief epoch"


@several_processes
def test_two_processes_agree_where_a_process_alone_would_move_its_levers(tmp_path):
    """batch_size="auto" and steps_per_execution="auto": alone, a process
    may grow the batch and move the steps per call in the run (each from its
    own timings and its own data's noise scale). Across processes those
    moves are not built, so each keeps both, says why, and they train alike,
    as one process does on their global batch."""
    first, second, alone = _run_beside_single(
        tmp_path, env_extra={"AUTO": "1"}, single_env={"AUTO": "1"}
    )
    for run in (first, second):
        plan = run["plan"]
        assert "trains on several processes" in plan["growth_reason"]
        assert plan["steps_per_execution"] == 1
        assert "on a cluster" in plan["steps_reason"]
        assert plan["global_batch_size"] == 64  # Keras's 32 a process, kept
    np.testing.assert_allclose(second["loss"], first["loss"], rtol=0, atol=0)
    np.testing.assert_allclose(first["loss"], alone["loss"], rtol=1e-5)
    for a, b, c in zip(
        first["weights"], second["weights"], alone["weights"], strict=True
    ):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
