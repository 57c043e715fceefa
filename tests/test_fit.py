import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import dense_model, toy_data
from realworld import Batches, Widened

import kerascale


def copy_of(model):
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    twin.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return twin


def test_pinned_plan_trains_exactly_like_model_fit():
    x, y = toy_data()
    model = dense_model()
    twin = copy_of(model)
    history = kerascale.fit(
        model,
        x,
        y,
        batch_size=16,
        precision="float32",
        strategy="default",
        epochs=2,
        shuffle=False,
        verbose=0,
    )
    twin.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert not history.plan.rebuild
    for a, b in zip(model.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert len(history.history["loss"]) == 2
    assert history.model is model


def test_user_model_holds_trained_weights_after_a_mixed_run(tmp_path):
    x, y = toy_data(256)
    model = dense_model(optimizer=keras.optimizers.Adam(1e-2))
    before = [w.copy() for w in model.get_weights()]
    history = kerascale.fit(
        model, x, y, precision="mixed_bfloat16", epochs=3, verbose=0, batch_size=32
    )
    # Set in place on the user's model, not a copy: nothing to copy back.
    assert not history.plan.rebuild and history.plan.precision == "mixed_bfloat16"
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(before, model.get_weights(), strict=True)
    )
    # The user's model is still float32 and is what was trained.
    assert model.layers[1].dtype_policy.name == "float32"
    final_loss = model.evaluate(x, y, verbose=0)
    assert final_loss == pytest.approx(history.history["loss"][-1], rel=0.25)
    assert int(model.optimizer.iterations) == 3 * 8
    path = tmp_path / "m.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_allclose(
        reloaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )
    assert keras.config.dtype_policy().name == "float32"


def test_batched_dataset_is_rebatched_to_the_requested_batch():
    x, y = toy_data(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    seen = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    history = kerascale.fit(
        dense_model(),
        ds,
        batch_size=32,
        precision="float32",
        epochs=1,
        verbose=0,
        callbacks=[Count()],
    )
    assert seen == [0, 1]
    assert (
        history.plan.data_changes.rebatch_from,
        history.plan.data_changes.batch,
    ) == (8, 32)
    auto = kerascale.plan(dense_model(), ds, precision="float32")
    assert (
        auto.global_batch_size == 8
        and "batched dataset" in auto.reasons["global_batch_size"]
    )


def test_validation_dataset_and_metrics():
    x, y = toy_data(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    model = dense_model(metrics=["accuracy"])
    history = kerascale.fit(
        model,
        ds,
        validation_data=ds,
        epochs=1,
        verbose=0,
        precision="float32",
        batch_size=32,
    )
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(history.history)


def test_verbose_0_prints_nothing(capsys):
    x, y = toy_data(64)
    kerascale.fit(
        dense_model(),
        x,
        y,
        precision="mixed_float16",
        epochs=1,
        verbose=0,
        batch_size=32,
    )
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ""


def test_verbose_prints_the_plan(capsys):
    x, y = toy_data(64)
    kerascale.fit(
        dense_model(), x, y, epochs=1, verbose=2, precision="float32", batch_size=32
    )
    out = capsys.readouterr().out
    assert "kerascale plan" in out and "precision  float32" in out
    assert "2/2 - " in out  # Keras's own progress line: 64 samples, batch 32
    # verbose=2 gives every reason in full (plan.explain()); 1, in brief. A
    # long reason wraps where the value column is wide (a long CPU name).
    assert "Keras's backend (KERAS_BACKEND); distributed" in " ".join(out.split())
    kerascale.fit(
        dense_model(), x, y, epochs=1, verbose=1, precision="float32", batch_size=32
    )
    out = capsys.readouterr().out
    assert "Keras's backend; distributed" in out


class Opaque(keras.Model):
    """A subclassed model that cannot be cloned (no get_config)."""

    def __init__(self, layer):
        super().__init__()
        self.body = layer
        self.head = keras.layers.Dense(2, activation="softmax")

    def call(self, x):
        return self.head(self.body(x))


def test_uncloneable_model_falls_back_and_says_what_was_not_applied():
    x, y = toy_data(64)
    model = Opaque(keras.layers.Dense(8))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    history = kerascale.fit(
        model, x, y, precision="mixed_bfloat16", epochs=1, verbose=0, batch_size=32
    )
    # Precision needs no copy: set in place, where cloning could not.
    assert history.plan.precision == "mixed_bfloat16" and not history.plan.rebuild
    assert not [w for w in history.plan.warnings if w.startswith("Not applied")]
    assert model.built and int(model.optimizer.iterations) == 2
    assert model.layers[0].dtype_policy.name == "float32"  # put back


def test_builder_function_is_called_under_the_policy():
    x, y = toy_data(64)

    def build():
        model = Opaque(keras.layers.Dense(8))
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    history = kerascale.fit(
        build, x, y, precision="mixed_bfloat16", epochs=1, verbose=0, batch_size=32
    )
    assert history.plan.precision == "mixed_bfloat16"
    assert history.model.body.dtype_policy.name == "mixed_bfloat16"
    assert int(history.model.optimizer.iterations) == 2
    assert keras.config.dtype_policy().name == "float32"


def test_builder_must_return_a_compiled_model():
    x, y = toy_data(16)
    with pytest.raises(kerascale.ModelError, match="compiled model"):
        kerascale.fit(
            lambda: keras.Sequential([keras.layers.Dense(1)]),
            x,
            y,
            verbose=0,
            batch_size=32,
        )


def test_unbuilt_sequential_is_built_from_the_data():
    x, y = toy_data(32)
    model = keras.Sequential(
        [keras.layers.Dense(4), keras.layers.Dense(2, activation="softmax")]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    kerascale.fit(
        model, x, y, precision="mixed_bfloat16", epochs=1, verbose=0, batch_size=32
    )
    assert model.built and model.predict(x, verbose=0).shape == (32, 2)


def test_interrupt_keeps_what_was_trained():
    x, y = toy_data(128)
    model = dense_model()
    before = model.get_weights()

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        kerascale.fit(
            model,
            x,
            y,
            precision="mixed_bfloat16",
            epochs=5,
            verbose=0,
            callbacks=[Stop()],
            batch_size=32,
        )
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(before, model.get_weights(), strict=True)
    )


def test_plan_trains_nothing():
    x, y = toy_data(64)
    model = dense_model()
    before = model.get_weights()
    p = kerascale.plan(model, x, y, batch_size=16)
    assert isinstance(p, kerascale.Plan) and p.global_batch_size == 16
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not model.optimizer.built


def test_model_errors():
    x, y = toy_data(16)
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    # Keras's own words, as model.fit raises them (a ValueError both ways).
    with pytest.raises(ValueError) as keras_said:
        uncompiled.fit(x, y, verbose=0)
    with pytest.raises(kerascale.ModelError) as ours:
        kerascale.fit(uncompiled, x, y)
    assert str(ours.value) == str(keras_said.value)
    assert isinstance(ours.value, ValueError)
    with pytest.raises(kerascale.ModelError, match="Received: model of type str"):
        kerascale.fit("model.keras", x, y)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": -1}, "batch_size=-1"),
        ({"batch_size": True}, "batch_size=True"),
        ({"strategy": "tpu_pod"}, "strategy='tpu_pod'"),
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"optimize_data": None}, "optimize_data=None"),
    ],
)
def test_fit_and_plan_validate_at_the_door(kwargs, match):
    x, y = toy_data(16)
    model = dense_model()
    for entry in (kerascale.fit, kerascale.plan):
        with pytest.raises(kerascale.ConfigurationError, match=match):
            entry(model, x, y, **kwargs)
    assert not model.optimizer.built  # nothing ran


def test_data_errors_reach_the_user():
    model = dense_model()
    with pytest.raises(kerascale.DataError, match="Data cardinality is ambiguous"):
        kerascale.fit(model, np.zeros((10, 4)), np.zeros(9), verbose=0)
    inf = tf.data.Dataset.from_tensor_slices(toy_data(8)).repeat()
    with pytest.raises(kerascale.DataError, match="infinite"):
        kerascale.fit(model, inf, verbose=0)
    history = kerascale.fit(
        model,
        inf,
        steps_per_epoch=2,
        epochs=1,
        verbose=0,
        batch_size=4,
        precision="float32",
    )
    assert len(history.history["loss"]) == 1


def test_cluster_environment_fails_clearly(monkeypatch):
    x, y = toy_data(16)
    tf_config = {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    # TensorFlow is running in this process already: it cannot join a cluster.
    with pytest.raises(
        kerascale.ClusterConfigError, match="Import kerascale at the top"
    ):
        kerascale.fit(dense_model(), x, y, verbose=0, batch_size=32)
    monkeypatch.setenv("TF_CONFIG", "{oops")
    with pytest.raises(
        kerascale.ClusterConfigError, match="TF_CONFIG is not valid JSON"
    ):
        kerascale.fit(dense_model(), x, y, verbose=0, batch_size=32)


QUIET_SCRIPT = """
import numpy as np, keras, tensorflow as tf, kerascale
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
# A rebatch and a re-creation silently, and a warning (float16 on CPU) shown;
# then the same warning filtered out by its category.
kerascale.fit(m, ds, batch_size=16, precision="mixed_float16", epochs=2, verbose=0,
              validation_data=ds)
import warnings
warnings.filterwarnings("ignore", category=kerascale.KerascaleWarning)
kerascale.fit(m, ds, batch_size=16, precision="mixed_float16", epochs=1, verbose=0)
"""


def _python_lines(stderr):
    # TensorFlow's C++ runtime logs through absl before Python can intervene;
    # those lines are TensorFlow's own, printed for model.fit alike.
    cxx = ("I0000", "W0000", "E0000", "WARNING: All log messages before absl")
    return [line for line in stderr.splitlines() if line and not line.startswith(cxx)]


def test_verbose_0_prints_no_progress_but_warnings_show_by_default():
    """In a plain script, with no logging configured: verbose=0 prints no
    progress; kerascale's warnings show, as Keras's do, and filter out by
    their category."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-c", QUIET_SCRIPT],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ""
    # Once, at the user's own call of fit (line 11 of the script): the second
    # fit's warning is filtered out, and nothing else is printed.
    assert _python_lines(proc.stderr) == [
        "<string>:11: KerascaleWarning: mixed_float16 on CPU is emulated: "
        'several times slower than float32. Use precision="auto".'
    ]


def test_infinite_validation_dataset_names_validation_steps():
    x, y = toy_data(16)
    inf = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    with pytest.raises(kerascale.DataError, match="validation_steps=None"):
        kerascale.fit(dense_model(), x, y, validation_data=inf, verbose=0)


def test_one_device_strategy_for_real():
    x, y = toy_data(64)
    model = dense_model()
    history = kerascale.fit(
        model,
        x,
        y,
        strategy="one_device",
        precision="float32",
        epochs=1,
        verbose=0,
        batch_size=32,
    )
    assert history.plan.strategy == "one_device" and history.plan.rebuild
    why = history.plan.reasons["rebuild"]
    assert why.code == "rebuild.scope" and why.details["strategy"] == "one_device"
    assert int(model.optimizer.iterations) == 2


def test_strategy_instance_whose_scope_holds_the_model_is_used_as_is():
    x, y = toy_data(64)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = dense_model()
    history = kerascale.fit(
        model,
        x,
        y,
        strategy=strategy,
        precision="float32",
        epochs=1,
        verbose=0,
        batch_size=32,
    )
    assert history.plan.strategy == "OneDeviceStrategy"
    assert not history.plan.rebuild
    assert int(model.optimizer.iterations) == 2


def test_plan_on_a_fake_gpu_box_through_the_hardware_seam(monkeypatch):
    from conftest import gpu_box

    from kerascale.sense import hardware

    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: gpu_box(4))
    x, y = toy_data(512)
    # max_batch_size states the memory bound: no probe (they would need the GPUs).
    p = kerascale.plan(dense_model(), x, y, batch_size=256, max_batch_size=256)
    assert (p.strategy, p.replicas, p.precision) == ("mirrored", 4, "mixed_bfloat16")
    assert p.micro_batch_size == 64 and p.accumulation_steps == 1 and p.rebuild
    assert p.hardware == "4x NVIDIA A100 (40.0 GiB, cc 8.0)"


def test_pydataset_trains_with_its_own_batches():
    x, y = toy_data(64)
    model = dense_model()
    data = Batches(x, y, 16)
    history = kerascale.fit(
        model,
        data,
        validation_data=data,
        precision="mixed_bfloat16",
        epochs=1,
        verbose=0,
    )
    assert history.plan.global_batch_size == 16
    assert int(model.optimizer.iterations) == 4
    assert "val_loss" in history.history
    # Keras ignores batch_size for a PyDataset; so does kerascale, and says so.
    with pytest.warns(kerascale.KerascaleWarning, match="batch_size=32 is ignored"):
        history = kerascale.fit(model, data, batch_size=32, verbose=0)
    assert history.plan.global_batch_size == 16


def test_a_python_generator_trains_as_keras_reads_it():
    x, y = toy_data(16)
    gen = ((x[i : i + 4], y[i : i + 4]) for i in range(0, 16, 4))
    model, plain = dense_model(), dense_model()
    with pytest.warns(kerascale.KerascaleWarning, match="passes your data to Keras"):
        kerascale.fit(model, gen, verbose=0)
    plain.fit(((x[i : i + 4], y[i : i + 4]) for i in range(0, 16, 4)), verbose=0)
    # As many steps as model.fit takes on it (Keras counts 5 for these 4 batches).
    assert int(model.optimizer.iterations) == int(plain.optimizer.iterations)


class Apply(keras.layers.Layer):
    """A custom layer holding a function: Keras cannot make its config, so the
    model looks cloneable (it is Functional) and cloning fails late."""

    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def call(self, x):
        return self.fn(x)


def test_a_layer_that_does_not_re_create_is_found_before_anything_runs():
    x, y = toy_data(64)
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, activation="softmax")(
        Apply(lambda t: t * 2)(inputs)
    )
    why = "layer 'apply' (Apply) does not re-create from its config"
    trains_as_it_is(keras.Model(inputs, outputs), x, y, why)


def trains_as_it_is(model, x, y, why):
    """`model` cannot be re-created: asked for a mirrored strategy (whose
    scope needs a copy) and mixed_bfloat16, it trains as it is, on one
    replica, with the precision set in place and one warning saying `why`."""
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    history = kerascale.fit(
        model,
        x,
        y,
        strategy="mirrored",
        precision="mixed_bfloat16",
        epochs=1,
        verbose=0,
        batch_size=32,
    )
    plan = history.plan
    assert not plan.rebuild and plan.strategy == "default"
    assert plan.precision == "mixed_bfloat16"
    (w,) = [w for w in plan.warnings if w.startswith("Not applied")]
    assert why in w and "strategy mirrored" in w
    assert int(model.optimizer.iterations) == 2


def test_model_whose_re_creation_fails_late_still_trains():
    x, y = toy_data(64)
    widened = Widened()
    widened.units = 3
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, activation="softmax")(widened(inputs))
    trains_as_it_is(
        keras.Model(inputs, outputs), x, y, "re-creating it failed: ValueError"
    )


def test_auto_batch_of_unbatched_data_on_a_cpu_is_keras_s(capsys, no_budget):
    """On a CPU the fastest batch in samples per second is not the fastest
    to an accuracy (issue 78: batch 800 cost a sequence model 0.04 of its
    accuracy): an "auto" batch of unbatched data is Keras's 32, nothing is
    probed however long the run, the plan says why and what to do, and
    float32 training gives `model.fit`'s weights."""
    x, y = toy_data(256)
    keras.utils.set_random_seed(0)
    model = dense_model()
    history = kerascale.fit(model, x, y, epochs=1, verbose=0, precision="float32")
    p = history.plan
    assert p.global_batch_size == 32
    assert p.reasons["global_batch_size"].code == "batch.keras_default"
    said = " ".join(p.explain().split())  # the same words, unwrapped
    assert "not the fastest to an accuracy" in said, said
    assert "kerascale.callbacks.NoiseScale" in said, said
    assert capsys.readouterr().out == ""  # verbose=0: no progress lines either
    keras.utils.set_random_seed(0)
    plain = dense_model()
    plain.fit(x, y, epochs=1, verbose=0)
    for a, b in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_memory_limit_that_cannot_be_used_is_not_silently_ignored():
    x, y = toy_data(64)
    p = kerascale.plan(
        dense_model(), x, y, batch_size=16, max_batch_size=8, memory_limit="4GiB"
    )
    assert any("memory_limit was not used" in w for w in p.warnings)
    assert (p.micro_batch_size, p.accumulation_steps) == (8, 2)


def test_a_requested_batch_is_checked_against_memory_limit_for_real():
    """On CPU with memory_limit, the requested batch is probed in a child
    process under that limit: it fits, so one probe and no accumulation."""
    x, y = toy_data(64)
    p = kerascale.plan(dense_model(), x, y, batch_size=16, memory_limit="4GiB")
    assert (p.micro_batch_size, p.accumulation_steps) == (16, 1)
    assert p.reasons["accumulation_steps"].code == "accumulation.fits"
    assert not p.warnings


@pytest.mark.parametrize("split, batch", [(None, 200), (0.5, 64)])
def test_a_batch_larger_than_the_training_data_is_said(split, batch):
    """Plain `fit` trains one step over all the samples without a word; the
    samples that train are those `validation_split` leaves (Keras's floor),
    and the batch search's ceiling is theirs too."""
    x, y = toy_data(100)
    extra = {"validation_split": split} if split else {}
    with pytest.warns(kerascale.KerascaleWarning) as caught:
        history = kerascale.fit(
            dense_model(),
            x,
            y,
            batch_size=batch,
            epochs=1,
            verbose=0,
            precision="float32",
            **extra,
        )
    said = [str(w.message) for w in caught if "is larger than" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    if split:
        assert "than the 50 samples that train (50 held back by" in said[0]
    else:
        assert "than your data (100 samples)" in said[0]
    assert history.history["loss"]  # it trained, as plain fit does
    plan = kerascale.plan(dense_model(), x, y, verbose=0, **extra)
    assert plan.global_batch_size <= (50 if split else 100)


def test_a_batch_within_the_training_data_says_nothing_of_it():
    x, y = toy_data(100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kerascale.fit(
            dense_model(),
            x,
            y,
            batch_size=50,
            validation_split=0.5,
            epochs=1,
            verbose=0,
            precision="float32",
        )
    assert not [w for w in caught if "is larger than" in str(w.message)]
