"""`kerascale.diagnose` on JAX: an input-bound run is called input-bound, with
the host loader `kerascale.fit` applies named and measured; a compute-bound
one is called compute-bound; an input it cannot read twice is refused."""

import time
import warnings

import keras
import numpy as np
import pytest

import kerascale


class Slow(keras.utils.PyDataset):
    """Batches of 256 that take `delay` seconds of host work each (a sleep:
    the time a decode or a disk read takes, with the GIL released)."""

    def __init__(self, delay, batches=40):
        super().__init__()
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(256, 512)).astype("float32")
        self.y = rng.integers(0, 10, 256).astype("int32")
        self.delay, self.batches = delay, batches

    def __len__(self):
        return self.batches

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x, self.y


def mlp(width=1024):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((512,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.once
def test_an_input_bound_run_is_called_so_with_the_input_measured():
    # Host work three times a step's, the step timed as diagnose times it
    # (on every device, on this machine as loaded now): Keras dispatches
    # steps ahead (its loop does not wait on their logs), so reading
    # overlaps the step, and the input is the limit either way.
    fast = kerascale.diagnose(mlp(), Slow(0), steps=8, precision="float32")
    delay = max(0.01, 3 / fast.step_batches_per_s)
    found = kerascale.diagnose(mlp(), Slow(delay), steps=12, precision="float32")
    assert found.bound == "input", str(found)
    # The input alone, as the loader's thread timed it: about one delay each.
    assert 0.5 / delay < found.input_batches_per_s < 1.05 / delay
    assert found.loader_batches_per_s is not None
    host = next(r for r in found.recommendations if "less host work" in r.action)
    assert host.expected_gain == pytest.approx(
        found.step_batches_per_s / found.input_batches_per_s
    )
    text = str(found)
    assert "with kerascale's loader" in text and "INPUT-bound" in text
    assert found.to_dict()["loader_batches_per_s"] == found.loader_batches_per_s


def test_the_loader_is_advised_with_its_measured_gain_where_it_helps():
    from kerascale.measure import advice

    # A run whose step waited on each read (model.fit 14.6 batches/s), and
    # with the reading on a thread ran at the step's rate.
    recs = advice.host_input_advice(28.2, 25.6, 14.6, 25.8)
    assert "kerascale.callbacks.Prefetch()" in recs[0].action
    assert recs[0].expected_gain == pytest.approx(25.8 / 14.6)
    # Where it did not help and the input is the limit: only the host's work.
    recs = advice.host_input_advice(10.0, 25.0, 9.9, 10.0)
    assert [r.action.split(":")[0] for r in recs] == ["less host work per batch"]


@pytest.mark.once
def test_a_compute_bound_run_is_called_so():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256 * 30, 512)).astype("float32")
    y = rng.integers(0, 10, len(x)).astype("int32")
    found = kerascale.diagnose(
        mlp(2048), x, y, batch_size=256, steps=10, precision="float32"
    )
    assert found.bound == "compute", str(found)
    assert found.plan.backend == "jax"


def test_a_generator_is_refused_naming_x_and_why():
    def gen():
        while True:
            yield np.zeros((8, 512), "float32"), np.zeros((8,), "int32")

    with pytest.raises(ValueError, match="used up as it is read"):
        kerascale.diagnose(mlp(), gen())


def test_a_grain_map_dataset_is_diagnosed_and_an_iter_dataset_refused():
    """As tests/test_diagnosis.py's, on JAX, and without Keras warning that
    shuffle=True is ignored (diagnose's own timing passes)."""
    pytest.importorskip("grain")
    import conformance

    ds, _, _ = conformance.make_input("grain")
    model = conformance.make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        found = kerascale.diagnose(model, ds, steps=3, verbose=0, precision="float32")
    assert found.bound in ("input", "compute", "memory"), str(found)
    with pytest.raises(ValueError, match="grain IterDataset is used up"):
        kerascale.diagnose(model, ds.to_iter_dataset())
