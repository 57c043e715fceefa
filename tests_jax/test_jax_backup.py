"""FaultTolerantBackup on the JAX backend, without TensorFlow: real SIGKILLs
and SIGTERMs of real training processes (tests_jax/backup_child.py), resumed
to the uninterrupted run's exact weights, order and History; a damaged save;
the writer lease; the state file itself."""

import json
import random
import signal
import subprocess
from pathlib import Path

import async_saves
import backup_child
import children
import keras
import numpy as np
import pytest

import kerascale
from kerascale.callbacks import FaultTolerantBackup
from kerascale.callbacks import _backup_state as state_lib
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import CheckpointError

# Tests marked nightly one by one: Keras's side only (CONTRIBUTING.md).
# One worker runs this module: its module-scoped fixtures or its cache
# of reference runs are made once (`--dist loadgroup`).
pytestmark = [pytest.mark.xdist_group("tests_jax/test_jax_backup")]

CHILD = children.TrainingChild(Path(__file__).with_name("backup_child.py"))
STEPS_PER_EPOCH = 20  # 320 samples, batch 16
EPOCHS = 4


def run_child(directory, out, *extra, timeout=240):
    result = CHILD.run(directory, out, *extra, timeout=timeout)
    assert "tensorflow imported: False" in result.stdout
    return result


child_cmd, run_and_kill = CHILD.command, CHILD.run_and_kill
load = children.load_npz


def assert_same_run(resumed, reference):
    """Bit-identical weights and optimizer state, and the same History."""
    keys = sorted(k for k in reference if k != "history")
    assert sorted(k for k in resumed if k != "history") == keys
    for k in keys:
        np.testing.assert_array_equal(resumed[k], reference[k], err_msg=k)
    h_ref, h_res = (json.loads(str(r["history"])) for r in (reference, resumed))
    assert len(h_res["loss"]) == EPOCHS
    assert h_res == h_ref


@pytest.fixture(scope="module")
def references():
    """Uninterrupted runs, per input, checkpointing every 3 steps like the
    interrupted ones; the arrays' also without any backup. Trained in this
    process: the child runs below must end on them bit for bit."""
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for kind in ("arrays", "pydataset", "generator"):
            out[kind] = backup_child.train(Path(d) / f"ckpt-{kind}", input=kind)
    out["plain"] = backup_child.train(None, no_backup=True)
    return out


# The tests below train with plain `model.fit` and the callback, which uses
# one device however many there are: `once` (README's 2-device run repeats
# only what the device count changes; kerascale.fit's runs below are not).
@pytest.mark.once
@pytest.mark.nightly
def test_checkpointing_does_not_change_training(references):
    assert_same_run(references["arrays"], references["plain"])


@pytest.mark.kill
@pytest.mark.once
@pytest.mark.parametrize("kind", ["arrays"])
def test_sigkill_mid_epoch_resumes_bit_identical(references, tmp_path, kind):
    """Keras shuffles arrays with NumPy's random (a PyDataset with Python's:
    in-process below), each process seeded alike: the resume puts back the
    state the epoch's shuffle drew from, and re-reads its consumed batches."""
    step = random.randint(STEPS_PER_EPOCH + 2, 2 * STEPS_PER_EPOCH - 2)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    rc, seen = run_and_kill(ckpt, out, step, "--input", kind)
    assert rc == -signal.SIGKILL and seen < EPOCHS * STEPS_PER_EPOCH
    # The newest usable one, as a resume picks it (the kill may land in a
    # save being written behind training: a leftover, skipped).
    _, meta = next(store.verified(store.scan(str(ckpt))))
    assert meta["state_format"] == "arrays" and meta["data"]["mode"] == "replay"
    assert 0 < meta["step"] < STEPS_PER_EPOCH  # mid-epoch
    result = run_child(ckpt, out, "--input", kind)
    assert "Resuming from" in result.stdout
    resumed = load(out)
    assert int(resumed["iterations"]) == EPOCHS * STEPS_PER_EPOCH
    assert_same_run(resumed, references[kind])


def interrupted(directory, step, **kwargs):
    """backup_child's training in this process, stopped after global step
    `step` (`children.interrupted`)."""
    children.interrupted(backup_child.train, directory, step, **kwargs)


@pytest.mark.nightly
def test_three_interruptions_of_a_generator_run_through_kerascale_fit(
    references, tmp_path
):
    """An infinite generator with steps_per_epoch: one iterator for the whole
    run, re-read up to its place on each resume; `kerascale.fit` with
    checkpoint_dir."""
    run = dict(input="generator", via_fit=True)
    reference = backup_child.train(tmp_path / "ref", **run)
    for step in sorted(random.sample(range(4, EPOCHS * STEPS_PER_EPOCH - 4), 3)):
        interrupted(tmp_path / "ckpt", step, **run)
    resumed = backup_child.train(tmp_path / "ckpt", **run)
    assert_same_run(resumed, reference)
    # kerascale.fit (over every device) trains as model.fit (on one) does,
    # up to the order of the gradient's sums.
    plain = references["generator"]
    for k in (k for k in plain if k != "history"):
        np.testing.assert_allclose(resumed[k], plain[k], atol=1e-5, err_msg=k)


@pytest.mark.once
@pytest.mark.nightly
def test_an_interrupted_pydataset_run_resumes_bit_identical(references, tmp_path):
    """A PyDataset shuffled from Python's random in `on_epoch_end`."""
    interrupted(tmp_path / "ckpt", STEPS_PER_EPOCH + 7, input="pydataset")
    meta = store.verify(store.scan(str(tmp_path / "ckpt"))[0])
    assert meta["data"]["mode"] == "replay" and 0 < meta["step"] < STEPS_PER_EPOCH
    resumed = backup_child.train(tmp_path / "ckpt", input="pydataset")
    assert_same_run(resumed, references["pydataset"])


@pytest.mark.once
@pytest.mark.nightly
def test_checkpoints_at_epoch_ends_resume_exactly(references, tmp_path):
    interrupted(tmp_path / "ckpt", 2 * STEPS_PER_EPOCH + 3, save_freq="epoch")
    meta = store.verify(store.scan(str(tmp_path / "ckpt"))[0])
    assert (meta["epoch"], meta["step"], meta["data"]["consumed"]) == (2, 0, 0)
    resumed = backup_child.train(tmp_path / "ckpt", save_freq="epoch")
    reference = backup_child.train(tmp_path / "ref", save_freq="epoch")
    assert_same_run(resumed, reference)
    assert_same_run(resumed, references["arrays"])


@pytest.mark.kill
@pytest.mark.once
def test_sigterm_saves_exits_143_chains_the_handler_and_resumes(references, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    rc, seen = run_and_kill(ckpt, out, 30, "--sigterm-handler", sig=signal.SIGTERM)
    assert rc == 143
    assert Path(str(out) + ".handler").read_text() == str(int(signal.SIGTERM))
    meta = store.verify(store.scan(str(ckpt))[0])
    assert meta["global_step"] in (seen, seen + 1)  # the next step boundary
    result = run_child(ckpt, out, "--sigterm-handler")
    assert "handler: user_handler" in result.stdout
    assert_same_run(load(out), references["arrays"])


@pytest.mark.kill
@pytest.mark.once
@pytest.mark.parametrize("point", ["mid-state", "behind"])
def test_a_kill_inside_a_save_leaves_the_previous_checkpoint(
    references, tmp_path, point
):
    """Killed with the 4th save's state file half written, or while that
    save (step 12) is written behind training, 2 steps later: it never
    becomes a checkpoint, and the rerun resumes from the 3rd (step 9)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    command = child_cmd(
        ckpt, out, "--die-in-save", f"{point}:4", "--step-sleep", "0.01"
    )
    children.killed_in_the_4th_save(command, store, ckpt, behind=point == "behind")
    result = run_child(ckpt, out)
    assert "ckpt-00000003" in result.stdout
    assert_same_run(load(out), references["arrays"])


@pytest.mark.kill
@pytest.mark.once
def test_a_damaged_latest_state_falls_back_to_the_previous(references, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    rc, _ = run_and_kill(ckpt, out, 25)
    assert rc == -signal.SIGKILL
    # The newest two that were written whole: the kill can come while a save
    # is written behind training (a leftover, which the resume removes), as
    # it did beside a busy loop, where the test damaged that one instead.
    complete = [f for f in store.scan(str(ckpt)) if f.state == "complete"]
    newest, previous = complete[:2]
    state = Path(newest.path) / "state.npz"
    state.write_bytes(state.read_bytes()[:-100])
    result = subprocess.run(
        child_cmd(ckpt, out), capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cannot be used" in result.stderr and previous.path in result.stdout
    assert_same_run(load(out), references["arrays"])


@pytest.mark.kill
@pytest.mark.once
def test_a_second_process_on_the_directory_stops_with_the_lease(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = subprocess.Popen(
        # Held after its first step (never released: killed below), so the
        # second process meets a run in progress however slowly it starts.
        child_cmd(ckpt, tmp_path / "a.npz", "--hold-until", str(tmp_path / "never")),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in first.stdout:
            if line.startswith("step"):
                break
        second = subprocess.run(
            child_cmd(ckpt, tmp_path / "b.npz"),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert second.returncode != 0
        assert "CheckpointError" in second.stderr and str(first.pid) in second.stderr
    finally:
        first.kill()
        first.wait()


# --- in this process ----------------------------------------------------------


@pytest.mark.once
@pytest.mark.nightly
def test_bfloat16_variables_round_trip_through_the_state_file(tmp_path):
    layer = keras.layers.Dense(3, dtype="bfloat16")
    layer.build((None, 2))
    other = keras.layers.Dense(3, dtype="bfloat16")
    other.build((None, 2))
    write = state_lib.writer({"model": layer.weights}, "arrays")
    write(str(tmp_path / "state"))
    # A save behind training writes the same file from its copy.
    state_lib.snapshot({"model": layer.weights}, "arrays").write(str(tmp_path / "s"))
    for prefix in ("state", "s"):
        state_lib.read(str(tmp_path / prefix), {"model": other.weights}, "arrays")
        for a, b in zip(layer.weights, other.weights, strict=True):
            assert str(b.dtype) == "bfloat16"
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="shape"):
        wrong = keras.layers.Dense(4, dtype="bfloat16")
        wrong.build((None, 2))
        state_lib.read(str(tmp_path / "state"), {"model": wrong.weights}, "arrays")


@pytest.mark.once
@pytest.mark.nightly
def test_a_checkpoint_of_another_optimizer_is_a_clear_error(tmp_path):
    from conftest import dense_model, toy_data

    x, y = toy_data()
    backup = FaultTolerantBackup(tmp_path, verbose=0)
    dense_model(optimizer="adam").fit(
        x, y, batch_size=16, epochs=1, callbacks=[backup], verbose=0
    )
    with pytest.raises(CheckpointError, match="optimizer: Adam then, SGD now"):
        dense_model(optimizer="sgd").fit(
            x,
            y,
            batch_size=16,
            epochs=2,
            callbacks=[FaultTolerantBackup(tmp_path, verbose=0)],
            verbose=0,
        )


@pytest.mark.nightly
def test_kerascale_fit_with_checkpoint_dir_trains_and_resumes_in_process(tmp_path):
    from conftest import dense_model, toy_data

    x, y = toy_data()
    first = kerascale.fit(
        dense_model(), x, y, batch_size=16, epochs=2, checkpoint_dir=tmp_path, verbose=0
    )
    assert first.plan.backend == "jax" and len(first.history["loss"]) == 2
    meta = store.verify(store.scan(str(tmp_path))[0])
    assert meta["finished"] and meta["versions"]["jax"]
    again = kerascale.fit(
        dense_model(), x, y, batch_size=16, epochs=3, checkpoint_dir=tmp_path, verbose=0
    )
    assert len(again.history["loss"]) == 3  # two restored, one trained
    assert again.history["loss"][:2] == first.history["loss"]


# --- saves written behind training (tests_common/async_saves.py) ------------


@pytest.mark.once
def test_writes_run_behind_training_one_at_a_time(tmp_path, monkeypatch):
    async_saves.check_writes_run_behind_training(tmp_path, monkeypatch)


@pytest.mark.once
def test_a_failed_background_write_warns_and_the_next_is_tried(tmp_path):
    async_saves.check_a_failed_write_warns_and_the_next_is_tried(tmp_path)


@pytest.mark.once
def test_background_writes_that_keep_failing_stop_training(tmp_path):
    async_saves.check_writes_that_keep_failing_stop_training(tmp_path)


@pytest.mark.once
def test_the_compiled_search_counts_the_checkpoints_host_copy(tmp_path, monkeypatch):
    """On a CPU the compiled step's count is held beside this process's
    share, which holds the state's copy while a save is written behind
    training (truth in the user's process)."""
    from kerascale.measure import host_share
    from kerascale.sense.model_facts import state_bytes

    shares = []
    real = host_share.for_search
    monkeypatch.setattr(
        host_share,
        "for_search",
        lambda *a, **k: shares.append(real(*a, **k)) or shares[-1],
    )
    x, y = np.zeros((4096, 256), "float32"), np.zeros(4096, "int32")

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512)])
        m.compile("adam", "sparse_categorical_crossentropy")
        return m

    plan = kerascale.plan(
        model(), x, y, memory_limit="1GiB", checkpoint_dir=str(tmp_path), verbose=0
    )
    assert plan.reasons["global_batch_size"].code == "batch.searched"
    assert shares and shares[-1].state_copy == state_bytes(model()) > 0
    assert "host copy" in shares[-1].why


@pytest.mark.parametrize("layout", ["one device", "replicated", "split"])
@pytest.mark.nightly
def test_a_snapshot_outlives_the_values_the_next_step_donates(tmp_path, layout):
    """The copy behind the step is the save's own: the step after it
    donates (deletes) the variables' buffers, and the snapshot still writes
    the values it was taken of, however a distribution lays them out."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if layout != "one device" and len(jax.local_devices()) < 2:
        pytest.skip("needs 2 devices")
    mesh = Mesh(np.array(jax.local_devices()[:2]), ("d",))
    spec = {"replicated": P(), "split": P("d")}.get(layout)
    values = [np.arange(32, dtype="float32").reshape(8, 4) + i for i in range(3)]

    class Held:  # what a snapshot reads of a variable: its value
        def __init__(self, array):
            self.value = (
                jax.device_put(array, NamedSharding(mesh, spec))
                if spec is not None
                else jax.device_put(array, jax.local_devices()[0])
            )

    held = [Held(v) for v in values]
    frozen = state_lib.snapshot({"model": held}, "arrays")
    for h in held:
        h.value.delete()  # as the next step's donation does
    frozen.write(str(tmp_path / "s"))
    layer_values = [keras.Variable(np.zeros((8, 4), "float32")) for _ in values]
    state_lib.read(str(tmp_path / "s"), {"model": layer_values}, "arrays")
    for want, got in zip(values, layer_values, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.nightly
def test_a_run_whose_rate_a_callback_moved_resumes(tmp_path):
    import learning_rate_cases

    learning_rate_cases.check_a_run_whose_rate_a_callback_moved_resumes(tmp_path)
