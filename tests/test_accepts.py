"""Whatever `model.fit` accepts, `kerascale.fit` accepts (issue 25).

One test per input kind that kerascale cannot read ahead, each beside plain
`model.fit` on the same data: it trains, says once what it skipped, and
keeps Keras's meanings. Then the model path: precision set in place on the
user's own model (its class, optimizer, compiled metrics kept and usable
after `fit`, its policies put back), a layer with Keras's Trainer mixed in,
and errors that stay Keras's own.
"""

import functools
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import dense_model, toy_data

import kerascale
from kerascale.apply import precision as precision_lib
from kerascale.sense import data_facts
from kerascale.sense.model_facts import is_builder, is_trainer


def regression_model(inputs=4):
    model = keras.Sequential(
        [keras.Input((inputs,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


def both(make_model, make_data, **kwargs):
    """(kerascale's History, plain fit's History, kerascale's warnings) from
    two models with the same initial weights on fresh copies of the data."""
    keras.utils.set_random_seed(0)
    model, (x, y) = make_model(), make_data()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ours = kerascale.fit(model, x, y, verbose=0, precision="float32", **kwargs)
    keras.utils.set_random_seed(0)  # the same weights and shuffles
    model, (x, y) = make_model(), make_data()
    theirs = model.fit(x, y, verbose=0, **kwargs)
    ours_said = [
        str(w.message) for w in said if w.category is kerascale.KerascaleWarning
    ]
    return ours, theirs, ours_said


X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = X[:, :1] * 2.0


def infinite():
    while True:
        for i in range(4):
            yield X[i * 16 : (i + 1) * 16], Y[i * 16 : (i + 1) * 16]


def finite():
    for i in range(4):
        yield X[i * 16 : (i + 1) * 16], Y[i * 16 : (i + 1) * 16]


def test_an_infinite_generator_trains_with_steps_per_epoch_as_in_keras():
    ours, theirs, said = both(
        regression_model, lambda: (infinite(), None), steps_per_epoch=3, epochs=2
    )
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert ours.plan.global_batch_size == 0  # unknown: kerascale did not read it
    (warning,) = [w for w in said if "passes your data to Keras" in w]
    assert "generator" in warning and "tf.data.Dataset" in warning


def test_a_finite_generator_with_a_generator_as_validation_data():
    keras.utils.set_random_seed(0)
    model = regression_model()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ours = kerascale.fit(
            model, finite(), validation_data=finite(), precision="float32", verbose=0
        )
    said = [str(w.message) for w in said if w.category is kerascale.KerascaleWarning]
    keras.utils.set_random_seed(0)
    theirs = regression_model().fit(finite(), validation_data=finite(), verbose=0)
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(
        ours.history["val_loss"], theirs.history["val_loss"], rtol=1e-5
    )
    assert len([w for w in said if "passes your data" in w]) == 1


def test_a_generator_is_never_consumed_to_inspect_it():
    read = []

    def counting():
        for i in range(4):
            read.append(i)
            yield X[i * 16 : (i + 1) * 16], Y[i * 16 : (i + 1) * 16]

    gen = counting()
    plan = kerascale.plan(regression_model(), gen, verbose=0)
    assert read == [] and plan.global_batch_size == 0
    assert len(list(gen)) == 4  # everything still there for training


def test_grain_datasets_train_as_in_keras():
    grain = pytest.importorskip("grain")

    def data():
        source = [(X[i], Y[i]) for i in range(64)]
        return grain.MapDataset.source(source).batch(16), None

    ours, theirs, said = both(regression_model, data, epochs=2)
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert any("MapDataset" in w for w in said)

    def iterable():  # an IterDataset, read once per epoch as Keras reads it
        source = [(X[i], Y[i]) for i in range(64)]
        return grain.MapDataset.source(source).batch(16).to_iter_dataset(), None

    ours, theirs, said = both(regression_model, iterable, epochs=1)
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert any("IterDataset" in w for w in said)


def test_ragged_tensor_inputs_train_as_in_keras():
    def make():
        model = keras.Sequential(
            [
                keras.layers.Lambda(
                    lambda t: (
                        tf.reduce_mean(t, axis=1, keepdims=True)
                        if isinstance(t, tf.RaggedTensor)
                        else keras.ops.mean(t, axis=1, keepdims=True)
                    )
                ),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
        return model

    def data():
        rows = [list(X[i, : 1 + i % 4]) for i in range(64)]
        return tf.ragged.constant(rows, dtype=tf.float32), Y

    ours, theirs, said = both(make, data, epochs=2, batch_size=16)
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert any("RaggedTensor" in w and "batch-size search" in w for w in said)
    assert ours.plan.global_batch_size == 16


def test_a_dict_input_with_an_optional_input_left_none():
    def make():
        a = keras.Input((4,), name="a")
        b = keras.Input((4,), name="b", optional=True)
        model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(a))
        model.compile(optimizer="sgd", loss="mse")
        return model

    ours, theirs, said = both(make, lambda: ({"a": X, "b": None}, Y), epochs=2)
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert any("an input is None" in w for w in said)


def test_a_python_list_of_strings_trains_a_model_with_its_own_preprocessing():
    texts = ["good movie", "bad film", "great fun", "awful plot"] * 16
    labels = np.array([1, 0, 1, 0] * 16, "float32")

    def make():
        inputs = keras.Input((), dtype="string")
        words = keras.layers.TextVectorization(
            output_mode="multi_hot", vocabulary=["good", "bad", "great"]
        )(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1, "sigmoid")(words))
        model.compile(optimizer="sgd", loss="binary_crossentropy")
        return model

    ours, theirs, said = both(
        make, lambda: (np.array(texts, dtype=object), labels), epochs=2, batch_size=16
    )
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert any("not numbers" in w for w in said)


def test_a_pydataset_ignores_batch_size_as_keras_does():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return X[i * 16 : (i + 1) * 16], Y[i * 16 : (i + 1) * 16]

    ours, theirs, said = both(
        regression_model, lambda: (Batches(), None), batch_size=64, epochs=1
    )
    np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    assert ours.plan.global_batch_size == 16
    assert any("batch_size=64 is ignored" in w for w in said)


def test_what_kerascale_reads_and_what_it_passes_through():
    assert data_facts.inspect(X, Y).measurable
    assert data_facts.inspect(tf.data.Dataset.from_tensor_slices((X, Y))).measurable
    facts = data_facts.inspect(finite())
    assert facts.kind == "other" and not facts.measurable
    assert not data_facts.inspect(["a", "b"], np.zeros(2)).measurable
    assert "Python lists" in data_facts.inspect(X, list(Y[:, 0])).why_not_measurable
    with pytest.raises(kerascale.DataError, match="same number of samples"):
        data_facts.inspect(X, Y[:10])


# The model path: precision set in place.


def test_precision_is_set_in_place_and_put_back():
    model = dense_model(metrics=["accuracy"])
    x, y = toy_data()
    model.fit(x, y, epochs=1, verbose=0)  # trained before, as in a notebook
    optimizer, cls = model.optimizer, type(model)
    seen = {}

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.update({layer.name: layer.dtype_policy.name for layer in model.layers})
            seen["optimizer"] = self.model.optimizer

    history = kerascale.fit(
        model, x, y, epochs=1, precision="mixed_bfloat16", verbose=0, callbacks=[Peek()]
    )
    assert history.plan.rebuild is False
    assert seen["hidden"] == "mixed_bfloat16" and seen["out"] == "float32"
    assert seen["optimizer"] is optimizer  # the user's, trained on
    assert type(model) is cls and model.optimizer is optimizer
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    assert "call" not in model.__dict__
    # The compiled metrics are the user's, built and readable after fit.
    assert set(model.get_metrics_result()) == {"loss", "accuracy"}


def test_mixed_float16_in_place_scales_the_loss_and_puts_the_optimizer_back():
    model, (x, y) = dense_model(), toy_data()
    optimizer = model.optimizer
    during = []

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            during.append(self.model.optimizer)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # emulated on a CPU: kerascale says so
        kerascale.fit(
            model,
            x,
            y,
            epochs=1,
            precision="mixed_float16",
            verbose=0,
            callbacks=[Peek()],
        )
    assert isinstance(during[0], keras.optimizers.LossScaleOptimizer)
    assert during[0].inner_optimizer is optimizer
    assert model.optimizer is optimizer and optimizer.iterations.numpy() == 2


def test_a_functional_model_with_a_raw_op_keeps_bf16():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4)(inputs)
    out = keras.layers.Dense(1)(hidden + inputs)  # a raw op: cloning failed on it
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        history = kerascale.fit(
            model, X, Y, epochs=1, precision="mixed_bfloat16", verbose=0
        )
    assert history.plan.precision == "mixed_bfloat16"
    assert not [w for w in said if "re-created" in str(w.message)]


def test_pinned_layers_and_a_subclassed_models_outputs_stay_float32():
    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8)
            self.pinned = keras.layers.Dense(8, dtype="float32")
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.pinned(self.hidden(x)))

    model = Sub()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(X, Y, epochs=1, verbose=0)
    seen = {}

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen["policies"] = {
                layer.name: layer.dtype_policy.name
                for layer in precision_lib.forward_layers(model)
            }
            seen["output"] = model(X[:2]).dtype

    kerascale.fit(
        model, X, Y, epochs=1, precision="mixed_bfloat16", verbose=0, callbacks=[Peek()]
    )
    assert seen["policies"][model.hidden.name] == "mixed_bfloat16"
    assert seen["policies"][model.pinned.name] == "float32"
    assert seen["output"] == "float32"
    assert model(X[:2]).dtype == "float32" and "call" not in model.__dict__


def test_metrics_from_an_earlier_compile_and_a_monitor_callback_work():
    model = regression_model()
    model.fit(X, Y, epochs=1, verbose=0)
    model.compile(optimizer="adam", loss="mse", metrics=["mae", "mse"])
    stop = keras.callbacks.EarlyStopping(monitor="mae", patience=0, mode="min")
    history = kerascale.fit(
        model, X, Y, epochs=3, callbacks=[stop], precision="mixed_bfloat16", verbose=0
    )
    assert {"loss", "mae", "mse"} <= set(history.history)
    assert set(model.get_metrics_result()) == {"loss", "mae", "mse"}


def test_a_layer_with_keras_trainer_mixed_in_trains_through_kerascale():
    # Keras's own test's class (TensorFlowTrainer; Trainer from Keras 3.16).
    from kerascale._keras_compat import tf_trainer_class

    TensorFlowTrainer = tf_trainer_class()

    class ExampleModel(TensorFlowTrainer, keras.layers.Dense):
        def __init__(self, units):
            keras.layers.Dense.__init__(
                self, units=units, use_bias=False, kernel_initializer="ones"
            )
            TensorFlowTrainer.__init__(self)

    model = ExampleModel(3)
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert is_trainer(model) and not is_builder(model)
    x, y = np.ones((64, 4), "float32"), np.zeros((64, 3), "float32")
    history = kerascale.fit(model, x, y, batch_size=16, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert history.history["loss"][1] < history.history["loss"][0]


def test_builders_are_functions_partials_and_callable_objects_not_layers():
    def build(units=1):
        return regression_model()

    class Factory:
        def __call__(self):
            return regression_model()

    assert is_builder(build) and is_builder(functools.partial(build, 2))
    assert is_builder(Factory())
    assert not is_builder(keras.layers.Dense(1)) and not is_builder(regression_model())


def test_an_error_in_the_first_step_is_keras_own_after_the_fallback():
    class Broken(keras.layers.Layer):
        def call(self, x):
            raise ValueError("this layer is broken on purpose")

    def make():
        model = keras.Sequential([keras.Input((4,)), Broken(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    with pytest.raises(Exception) as theirs:
        make().fit(X, Y, epochs=1, verbose=0)
    with pytest.raises(Exception) as ours:
        kerascale.fit(make(), X, Y, epochs=1, verbose=0)
    assert type(ours.value) is type(theirs.value)
    assert "broken on purpose" in str(ours.value)


class Counting(keras.Model):
    """Counts its calls in a variable: any eager call kerascale makes shows."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.calls = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="calls"
        )

    def call(self, x):
        self.calls.assign_add(1.0)
        return self.dense(x)


def test_planning_leaves_no_trace_on_an_unbuilt_model():
    model = Counting()
    model.compile(optimizer="sgd", loss="mse")
    kerascale.plan(model, X, Y, verbose=0)
    assert model.built and float(model.calls.numpy()) == 0.0
    keras.utils.set_random_seed(0)
    plain = Counting()
    plain.compile(optimizer="sgd", loss="mse")
    plain.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    kerascale.fit(model, X, Y, batch_size=16, epochs=1, verbose=0)
    # Only the training steps counted, as in model.fit.
    assert float(model.calls.numpy()) == float(plain.calls.numpy()) == 4.0


def test_a_second_fit_with_the_same_plan_reuses_what_keras_traced():
    model = regression_model()
    used = []

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            used.append(self.model.train_function)

    def fit():
        kerascale.fit(
            model,
            X,
            Y,
            batch_size=16,
            precision="mixed_bfloat16",
            verbose=0,
            callbacks=[Peek()],
        )
        return used[-1]

    first = fit()
    assert model.train_function is None  # the user's (none yet), put back
    assert fit() is first  # the same traced function: no retrace
    model.fit(X, Y, batch_size=16, verbose=0)  # plain fit: the user's own
    assert fit() is first
    model.compile(optimizer="sgd", loss="mse")  # compiled again: traced anew
    assert fit() is not first


def test_a_dict_output_model_with_a_raw_op_trains_and_keeps_keras_errors(
    bf16_cpu,
):
    def make():
        inputs = keras.Input((4,), name="x")
        hidden = keras.layers.Dense(8)(inputs)
        a = keras.layers.Dense(1, name="a")(hidden)
        b = keras.layers.Dense(1, name="b")(hidden) + inputs[:, :1]  # a raw op
        model = keras.Model(inputs, {"a": a, "b": b})
        model.compile(optimizer="sgd", loss={"a": "mse", "b": "mse"})
        return model

    targets = {"a": Y, "b": Y}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        history = kerascale.fit(
            make(), X, targets, batch_size=16, precision="mixed_bfloat16", verbose=0
        )
    assert set(history.history) == {"loss", "a_loss", "b_loss"}
    assert history.plan.precision == "mixed_bfloat16"
    assert not [w for w in said if w.category is kerascale.KerascaleWarning]
    # A target missing: the error model.fit raises, word for word.
    with pytest.raises(ValueError) as theirs:
        make().fit(X, {"a": Y}, verbose=0)
    with pytest.raises(ValueError) as ours:
        kerascale.fit(make(), X, {"a": Y}, verbose=0)
    assert str(ours.value) == str(theirs.value)
