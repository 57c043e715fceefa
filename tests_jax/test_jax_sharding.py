"""A model whose replica does not fit one device's memory (`device_memory`,
for CPU devices, which report none) is sharded over the devices
(`ModelParallel`, its large variables split) by the compiler's count, trains,
and trains as the unsharded run does; one that fits stays data-parallel.
Runs on 2 devices here, and on 4 in a child process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import xla_flags
from conftest import devices

import kerascale
from kerascale.plan import model_sharding as sharding

several = pytest.mark.skipif(devices() < 2, reason="needs 2 devices or more")
SMALL_DEVICE = "80MiB"  # the large model's replica needs ~100 MiB, split ~68


def test_large_variables_are_split_along_their_largest_divisible_axis():
    shapes = [
        sharding.VariableShape("big/kernel", (512, 2048), 512 * 2048 * 4),
        sharding.VariableShape("odd/kernel", (3, 1_000_001), 12_000_012),
        sharding.VariableShape("big/bias", (2048,), 2048 * 4),  # small: replicated
        sharding.VariableShape("square/kernel", (1024, 1024), 1024 * 1024 * 4),
    ]
    split = sharding.layouts(shapes, 2)
    assert split == {
        "big/kernel": (None, "model"),
        "square/kernel": (None, "model"),  # a tie: the last axis
    }  # "odd/kernel": no axis that 2 divides
    assert sharding.meshes(4) == [(2, 2), (1, 4)]
    assert sharding.meshes(1) == []
    assert sharding.bytes_per_device(shapes, split, 2) == (
        512 * 2048 * 2 + 12_000_012 + 2048 * 4 + 1024 * 1024 * 2
    )


def large_model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((512,))
    h = keras.layers.Dense(2048, activation="relu", name="wide")(inputs)
    h = keras.layers.Dense(2048, activation="relu", name="deep")(h)
    outputs = keras.layers.Dense(10, name="out")(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def small_model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((512,))
    outputs = keras.layers.Dense(10)(keras.layers.Dense(64, activation="relu")(inputs))
    model = keras.Model(inputs, outputs)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(n=128):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 512)).astype("float32"), rng.integers(0, 10, n)


@several
def test_a_replica_over_device_memory_is_sharded_and_trains_as_unsharded():
    x, y = data()
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = large_model()
    history = kerascale.fit(model, x, y, device_memory=SMALL_DEVICE, **fit)
    plan = history.plan
    assert plan.strategy == "model_parallel", plan
    batch, model_axis = plan.sharding["mesh"]
    assert batch * model_axis == devices() and model_axis >= 2
    assert set(plan.sharding["layouts"]) >= {"wide/kernel", "deep/kernel"}
    figures = plan.sharding["bytes"]
    limit = 80 << 20
    assert figures["replicated"] > limit >= figures["sharded"], figures
    assert plan.reasons["sharding"].code == "sharding.chosen"
    assert "split over a model axis" in plan.reasons["sharding"]
    # of the meshes that fit, the one whose real step trains fastest
    seconds = plan.sharding["seconds_per_step"]
    if devices() == 2:
        assert seconds == {} and "the only mesh" in plan.reasons["sharding"]
    else:  # 4 devices: 2 x 2 and 1 x 4 both fit 80 MiB, and were timed
        assert list(seconds) == ["2 x 2", "1 x 4"] and min(seconds.values()) > 0
        best = min(seconds.values())
        chosen = next(m for m, s in seconds.items() if best / s >= 0.95)
        assert chosen == f"{batch} x {model_axis}", (seconds, plan.sharding["mesh"])
        assert "trains fastest" in plan.reasons["sharding"]
    assert "mesh" in str(plan)
    # the unsharded run, where a device holds a whole replica
    reference = large_model()
    unsharded = kerascale.fit(reference, x, y, device_memory="8GiB", **fit)
    assert unsharded.plan.strategy == "data_parallel"
    np.testing.assert_allclose(
        history.history["loss"], unsharded.history["loss"], rtol=1e-5
    )
    # the weights too, to float noise (a 2 x 2 mesh sums in another order)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # the model is the user's again: no layout, no distribution
    assert keras.distribution.distribution() is None
    assert all(v.value.sharding.is_fully_replicated for v in model.weights)


@several
def test_a_replica_that_fits_stays_data_parallel_and_says_so():
    x, y = data()
    plan = kerascale.plan(small_model(), x, y, device_memory=SMALL_DEVICE, verbose=0)
    assert plan.strategy == "data_parallel" and not plan.sharding
    assert plan.reasons["sharding"].code == "sharding.fits"


def test_device_memory_is_checked_at_the_door():
    x, y = data(16)
    with pytest.raises(kerascale.ConfigurationError, match="device_memory"):
        kerascale.plan(small_model(), x, y, device_memory="lots", verbose=0)


COMMON = str(Path(__file__).resolve().parent.parent / "tests_common")


@pytest.mark.skipif(devices() != 1, reason="run once, from the 1-device suite")
def test_on_four_devices_too():
    env = {**os.environ, "XLA_FLAGS": xla_flags.forced_devices(4)}
    here = Path(__file__)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(here),
            "-k",
            "sharded_and_trains or stays_data_parallel",
        ],
        cwd=here.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout


@several
def test_a_sharded_checkpoint_resumes_on_another_mesh_and_on_one_device(tmp_path):
    x, y = data()
    fit = dict(batch_size=16, shuffle=False, verbose=0)
    checkpoints = str(tmp_path / "checkpoints")
    first = large_model()
    kerascale.fit(
        first,
        x,
        y,
        device_memory=SMALL_DEVICE,
        epochs=2,
        checkpoint_dir=checkpoints,
        **fit,
    )
    # the same devices, data-parallel: another mesh
    resumed = large_model(seed=1)  # its own start: the checkpoint's wins
    history = kerascale.fit(
        resumed, x, y, device_memory="8GiB", epochs=3, checkpoint_dir=checkpoints, **fit
    )
    assert history.plan.strategy == "data_parallel"
    straight = large_model()
    expected = kerascale.fit(
        straight, x, y, device_memory=SMALL_DEVICE, epochs=3, **fit
    )
    np.testing.assert_allclose(
        history.history["loss"], expected.history["loss"], rtol=1e-5
    )
    for a, b in zip(resumed.get_weights(), straight.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # and on one device, in a process of its own: the checkpoint of epoch 3
    child = f"""
import os, sys, json
sys.path[:0] = [{str(Path(__file__).parent)!r}, {COMMON!r}]  # tests_common too
import numpy as np, kerascale
from test_jax_sharding import large_model, data
x, y = data()
model = large_model(seed=2)
h = kerascale.fit(model, x, y, batch_size=16, shuffle=False, verbose=0, epochs=3,
                  checkpoint_dir={checkpoints!r})
print(json.dumps({{"replicas": h.plan.replicas, "loss": h.history["loss"],
                  "sum": float(sum(np.abs(w).sum() for w in model.get_weights()))}}))
"""
    env = {**os.environ, "XLA_FLAGS": ""}
    done = subprocess.run(
        [sys.executable, "-c", child],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    alone = json.loads(done.stdout.strip().splitlines()[-1])
    assert alone["replicas"] == 1
    np.testing.assert_allclose(alone["loss"], expected.history["loss"], rtol=1e-5)
    # restored exactly: the weights the resumed run saved, to the last bit
    assert alone["sum"] == float(sum(np.abs(w).sum() for w in resumed.get_weights()))


def test_a_check_that_cannot_compile_leaves_the_plan_as_it_is_with_one_warning(
    monkeypatch,
):
    from kerascale.errors import BatchSizeSearchError
    from kerascale.measure.jax import replica_fit

    def fails(*args):
        raise BatchSizeSearchError("Compiling the train step failed: the seam")

    monkeypatch.setattr(replica_fit, "_per_device", fails)
    x, y = data(32)
    plan = kerascale.plan(small_model(), x, y, device_memory=SMALL_DEVICE, verbose=0)
    assert plan.strategy in ("default", "data_parallel") and not plan.sharding
    said = [w for w in plan.warnings if "no sharding check" in w]
    assert len(said) == 1 and "the seam" in said[0]


def test_the_mesh_that_fits_and_trains_fastest_is_chosen():
    def mesh(model_axis, need, seconds=None, untimed=""):
        return sharding.Candidate(
            (4 // model_axis, model_axis), {}, "derived", 16, need, seconds, untimed
        )

    usable = 100
    pick = sharding.choose
    fast, slow, over = mesh(4, 50, 0.01), mesh(2, 90, 0.02), mesh(2, 120, 0.001)
    assert pick([slow, fast], usable)[0] is fast
    why = pick([slow, fast], usable)[1]
    assert why.code == "mesh.fastest" and why.details["rate"] == 1600
    assert pick([over, fast], usable)[0] is fast  # a fast mesh over the limit
    tie = mesh(4, 50, 0.0204)  # 2% slower: the smaller model axis is kept
    chosen, why = pick([slow := mesh(2, 90, 0.02), tie], usable)
    assert chosen is slow and why.code == "mesh.fastest" and not why.details["tie"]
    chosen, why = pick([tie, slow], usable)  # the order tried decides a tie
    assert chosen is tie and why.details["tie"] == 0.05
    untimed = [mesh(2, 90, untimed="not timed: 1 MiB free here"), mesh(4, 50)]
    chosen, why = pick(untimed, usable)
    assert chosen is untimed[0] and why.code == "mesh.untimed"
    assert why.details["why"] == "not timed: 1 MiB free here"
    assert pick([over], usable) == (None, None)
    assert pick([over, fast], usable)[1].code == "mesh.only_fit"
    text = sharding.describe([over, fast], usable)
    assert "2 x 2: 120 B (over)" in text and "1 x 4: 50 B, 10.0 ms" in text


@several
def test_a_second_plan_reads_the_decision_from_the_cache(monkeypatch):
    """A compile per mesh (20 s and more each on a GPU) is made once."""
    from kerascale.measure.jax import replica_fit

    x, y = data()
    first = kerascale.plan(
        large_model(), x, y, batch_size=16, device_memory=SMALL_DEVICE, verbose=0
    )

    def compiles(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(replica_fit, "_measured", compiles)
    again = kerascale.plan(
        large_model(), x, y, batch_size=16, device_memory=SMALL_DEVICE, verbose=0
    )
    assert again.sharding == first.sharding and again.strategy == "model_parallel"
    assert "read from kerascale's cache" in again.reasons["sharding"]
    # another limit is another decision: compiled (here, refused) again
    with pytest.raises(AssertionError, match="compiled again"):
        kerascale.plan(
            large_model(), x, y, batch_size=16, device_memory="70MiB", verbose=0
        )
