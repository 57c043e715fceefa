"""The measurements' budget: the batch search's ladder and the trials run
only where the share of the run they are expected to save repays their cost."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import dense_model, toy_data

import kerascale
from kerascale import _keras_compat as keras_compat
from kerascale.measure import budget, child, first_step
from kerascale.measure.search import LADDER_CHUNK, ladder
from kerascale.sense import data_facts, samples


def no_children(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a probe child was started")

    monkeypatch.setattr(child, "IsolatedProber", refuse)


def test_the_ladder_doubles_from_kerass_default_to_the_cap():
    assert ladder(256) == [32, 64, 128, 256]
    assert ladder(100) == [32, 64, 100]
    assert ladder(16) == [16]
    assert ladder(1000, granularity=8) == [32, 64, 128, 256, 512, 1000]


def test_the_search_cost_counts_a_child_per_chunk_and_each_rung():
    """Quickstart-sized: four rungs in one child, steps too short to
    matter; seven rungs take two children."""
    cost = budget.search_seconds([32, 64, 128, 256], per_sample=1e-5, steps=3)
    assert cost == pytest.approx(2.5 + 4 * (0.5 + 0.3) + 480 * 1e-5)
    seven = budget.search_seconds([32] * 7, per_sample=1e-5, steps=3)
    assert seven == pytest.approx(2 * 2.5 + 7 * (0.5 + 0.3) + 7 * 32e-5)
    # Slow steps are paid for: 3 timed steps and a validation step a rung.
    slow = budget.search_seconds([64], per_sample=0.01, steps=3)
    assert slow == pytest.approx(2.5 + 0.5 + 3 * 0.64 + 0.64)
    # A ladder in this process (kerascale.measure.headroom) starts no child.
    here = budget.search_seconds([32] * 7, per_sample=1e-5, steps=3, in_children=False)
    assert here == pytest.approx(7 * (0.5 + 0.3) + 7 * 32e-5)


def test_a_measurement_runs_where_its_expected_saving_repays_it():
    """A weighing expected to save 10% of a 100 s run repays 9 s, not 30 s;
    the reason names the cost, the saving and the run."""
    assert budget.unpaid(9.0, 100.0, 0.10, "recompute") is None
    assert budget.unpaid(30.0, 100.0, 0.10, "recompute") == (
        "the weighing would take about 30s; it may save 10% of a run of about 100s"
    )
    price = budget.Price("recompute", 30.0, 100.0, 0.10)
    assert budget.refused(price) == budget.unpaid(30.0, 100.0, 0.10, "recompute")
    assert price.saving == pytest.approx(-20.0)
    why = budget.unpaid(8.3, 0.62, 0.03, "data_changes")
    assert why == (
        "the pipeline trials would take about 8.3s; it may save 3% of a run of "
        "about 0.6s"
    )
    # The priors rank what pays: the precision trial over the pipeline's.
    gains = budget.GAINS["tensorflow"]
    assert gains["precision"] > gains["data_changes"]
    assert budget.value(9.0, 100.0, 0.25) == pytest.approx(16.0)


class Noisy(keras.layers.Layer):
    """Draws from its own seed generator and counts its calls in a
    non-trainable variable even in inference: the worst a forward pass can
    change."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = keras.random.SeedGenerator(7)

    def build(self, shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        self.calls.assign_add(1.0)
        return x + 0.0 * keras.random.normal(keras.ops.shape(x), seed=self.generator)


def test_the_first_estimate_leaves_the_model_and_random_state_alone():
    inputs = keras.Input((8,))
    h = keras.layers.BatchNormalization()(Noisy()(inputs))
    h = keras.layers.Dropout(0.5)(keras.layers.Dense(16)(h))
    model = keras.Model(inputs, keras.layers.Dense(2)(h))
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = toy_data(64, inputs=8)
    keras.random.normal((2,))  # the global seed generator exists
    glob = keras_compat.existing_global_seed_generator()
    before = [v.numpy().copy() for v in model.variables]
    glob_before = glob.state.numpy().copy()
    py, np_state = random.getstate(), np.random.get_state()[1].copy()

    per = first_step.train_seconds_per_sample(
        model, x, y, data_facts.inspect(x, y, steps_per_epoch=None)
    )

    assert per is not None and 0 < per < 0.1
    for a, b in zip(before, model.variables, strict=True):
        np.testing.assert_array_equal(a, b.numpy())
    np.testing.assert_array_equal(glob_before, glob.state.numpy())
    assert random.getstate() == py
    np.testing.assert_array_equal(np_state, np.random.get_state()[1])


def test_the_first_estimate_is_taken_once_per_model_and_input_shape(monkeypatch):
    """A loop of `fit` calls on one model pays for one forward pass estimate;
    another input shape or another model measures again."""
    passes = []
    real = first_step._forward_seconds
    monkeypatch.setattr(
        first_step, "_forward_seconds", lambda *a: passes.append(1) or real(*a)
    )
    model = dense_model()
    x, y = toy_data(64)
    data = data_facts.inspect(x, y, steps_per_epoch=None)
    first = first_step.train_seconds_per_sample(model, x, y, data)
    taken = len(passes)
    assert taken >= 3 and first is not None
    assert first_step.train_seconds_per_sample(model, x[:32], y[:32], data) == first
    assert len(passes) == taken
    first_step.train_seconds_per_sample(dense_model(), x, y, data)
    assert len(passes) == 2 * taken


def test_no_estimate_where_the_model_cannot_be_called_on_its_inputs():
    class NeedsTrainStep(keras.Model):  # a GAN-like model: no call()
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(1)

        def build(self, shape):
            self.d.build(shape)

    model = NeedsTrainStep()
    model.build((None, 4))
    model.compile("sgd", "mse")
    x, y = toy_data(32)
    data = data_facts.inspect(x, y, steps_per_epoch=None)
    assert first_step.train_seconds_per_sample(model, x, y, data) is None
    assert first_step.train_seconds_per_sample(dense_model, x, y, data) is None


@pytest.mark.serial
def test_a_short_fit_trains_at_kerass_default_without_searching(monkeypatch):
    """One epoch of 256 samples on the real estimate: no child is started,
    the batch is Keras's default, and the plan says why and how to search."""
    no_children(monkeypatch)
    x, y = toy_data(256)
    history = kerascale.fit(
        dense_model(), x, y, epochs=1, verbose=0, precision="float32"
    )
    plan = history.plan
    assert plan.global_batch_size == 32
    why = plan.reasons["global_batch_size"]
    assert "Keras's default 32 per replica (batch search skipped: on a CPU" in why
    assert "pass batch_size= to choose one" in why
    assert history.history["loss"]  # it trained


@pytest.mark.parametrize("per_sample", [1e-2, 1e-5, None])
@pytest.mark.serial
def test_a_cpus_auto_batch_is_not_searched_however_long_the_run(
    monkeypatch, per_sample
):
    """50 epochs of 256 samples at 10 ms a sample (a 128 s run), at 10 us, or
    with no estimate: a CPU's "auto" batch is Keras's 32 whatever the run
    would repay (issue 78: the fastest batch in samples per second is not
    the fastest to an accuracy), and no child is started. The budget still
    gates the searches of GPUs and TPUs (`budget.unpaid`, above)."""
    no_children(monkeypatch)
    monkeypatch.setattr(
        first_step, "train_seconds_per_sample", lambda *a, **k: per_sample
    )
    x, y = toy_data(256)
    plan = kerascale.plan(
        dense_model(), x, y, epochs=50, verbose=0, precision="float32"
    )
    why = plan.reasons["global_batch_size"]
    assert why.code == "batch.keras_default"
    assert "batch search skipped: on a CPU" in why


@pytest.mark.serial
def test_a_bound_the_user_gave_is_always_searched_under(monkeypatch):
    """memory_limit= (or max_batch_size=) asks for a bound Keras's default
    batch might break: a run of any length searches under it."""
    x, y = toy_data(256)
    plan = kerascale.plan(
        dense_model(),
        x,
        y,
        epochs=1,
        verbose=0,
        precision="float32",
        max_batch_size=16,
    )
    assert plan.reasons["global_batch_size"].code == "batch.searched"
    assert plan.global_batch_size <= 16


@pytest.mark.serial
def test_a_cached_search_is_used_whatever_the_run(monkeypatch, no_budget):
    """A CPU's Keras batch checked under a bound (max_batch_size), cached."""
    x, y = toy_data(256)
    bound = {"verbose": 0, "precision": "float32", "max_batch_size": 16}
    kerascale.plan(dense_model(), x, y, **bound)
    monkeypatch.setattr(budget, "REPAY", 1.0)
    no_children(monkeypatch)
    plan = kerascale.plan(dense_model(), x, y, **bound)
    assert plan.reasons["global_batch_size"].details["how"] == "cached search"


def shuffled(n=512):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=1)
    return ds.map(lambda a, b: (a * 2.0, b))


def seeded_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


def test_trials_leave_the_datasets_shuffle_order_alone(no_budget):
    """The trials time candidates on the user's pipeline many times over;
    a seeded shuffle would then give training other epoch orders than
    model.fit. They time a copy with shuffles of its own: the same plan
    trains to bit-identical weights."""
    plain = seeded_model()
    plain.fit(shuffled().batch(32), epochs=2, verbose=0)
    model = seeded_model()
    history = kerascale.fit(
        model, shuffled(), batch_size=32, precision="float32", epochs=2, verbose=0
    )
    assert history.plan.reasons["data_changes"].code == "trials.measured"
    for a, b in zip(plain.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_peeking_at_variable_shapes_leaves_the_order_alone():
    """Sequences of varying length: planning reads the first elements for
    the longest; the user's dataset then yields what it would have."""

    def make():
        lengths = tf.data.Dataset.range(1, 40).shuffle(39, seed=2)
        return lengths.map(lambda n: (tf.ones([n]), n))

    expected = list(make().map(lambda s, n: n).as_numpy_iterator())
    ds = make()
    facts = data_facts.inspect(ds, None, steps_per_epoch=None)
    samples.element_structure(ds, None, facts)
    assert list(ds.map(lambda s, n: n).as_numpy_iterator()) == expected


@pytest.mark.parametrize(
    "cap, chunks",
    [
        (256, [[32, 64, 128, 256]]),
        (512, [[32, 64, 128, 256, 512]]),
        (100, [[32, 64, 100]]),
        (4096, [[32, 64, 128, 256, 512, 1024], [2048, 4096]]),
    ],
)
@pytest.mark.serial
def test_the_rungs_run_in_the_children_the_cost_counts(cap, chunks):
    """The budget counts a child per LADDER_CHUNK rungs (search_seconds): a
    throughput search still speeding up sweeps exactly those chunks, the cap
    in its chunk."""
    from kerascale.measure.result import ProbeResult
    from kerascale.measure.search import search

    swept = []

    def sweep(batches):
        swept.append(list(batches))
        return [ProbeResult(b, "ok", peak_bytes=b, samples_per_s=b) for b in batches]

    search(lambda b: sweep([b])[0], cap=cap, mode="throughput", sweep=sweep)
    assert swept == chunks
    assert len(swept) == -(-len(ladder(cap)) // LADDER_CHUNK)
