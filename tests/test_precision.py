import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import dense_model, toy_data

from kerascale.apply import model as model_lib
from kerascale.apply import precision as precision_lib
from kerascale.sense.model_facts import recreation_problem


def default_strategy():
    return tf.distribute.get_strategy()


def cnn():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=2,
        jit_compile=False,
    )
    return model


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_in_place_keeps_weights_and_predictions_with_float32_outputs(policy):
    model = cnn()
    x = np.random.default_rng(0).normal(size=(16, 8, 8, 3)).astype("float32")
    before, weights = model.predict(x, verbose=0), model.get_weights()
    undo = precision_lib.apply(model, policy)
    assert model.layers[1].dtype_policy.name == policy  # the conv
    assert model.layers[-1].dtype_policy.name == "float32"  # the output layer
    after = model.predict(x, verbose=0)
    assert after.dtype == np.float32
    np.testing.assert_allclose(after, before, atol=2e-2)  # bf16 has 8 bits of mantissa
    undo()
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    for a, b in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)
    assert keras.config.dtype_policy().name == "float32"  # global policy unchanged


def test_recreate_copies_the_model_as_its_own_class_in_its_own_policy():
    model = cnn()
    new = model_lib.recreate(model, "mixed_bfloat16", default_strategy())
    assert new is not model and type(new) is type(model)
    assert {layer.dtype_policy.name for layer in new.layers} == {"float32"}
    for a, b in zip(model.get_weights(), new.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_rebuild_keeps_compile_settings():
    model = cnn()
    new = model_lib.recreate(model, "mixed_bfloat16", default_strategy())
    assert new.compiled
    assert new.steps_per_execution == 2
    assert new.jit_compile is False
    assert isinstance(new.optimizer, keras.optimizers.Adam)
    assert float(new.optimizer.learning_rate) == pytest.approx(3e-3)
    assert new.optimizer is not model.optimizer
    x = np.zeros((4, 8, 8, 3), "float32")
    logs = new.evaluate(x, np.zeros(4), verbose=0, return_dict=True)
    assert set(logs) == {"loss", "accuracy"}


def test_float16_gets_loss_scaling_around_the_users_optimizer():
    model = dense_model()
    optimizer = model.optimizer
    undo = precision_lib.apply(model, "mixed_float16")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.optimizer.inner_optimizer is optimizer
    undo()
    assert model.optimizer is optimizer


def test_optimizer_state_is_carried_over_both_ways():
    model = dense_model(optimizer="adam")
    x, y = toy_data()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    new = model_lib.recreate(model, "float32", default_strategy())
    inner = model_lib.core_optimizer(new.optimizer)
    assert int(inner.iterations) == 4
    for a, b in zip(model.optimizer.variables, inner.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    new.fit(x, y, epochs=1, batch_size=16, verbose=0)
    model_lib.copy_back(new, model)
    assert int(model.optimizer.iterations) == 8
    for a, b in zip(model.get_weights(), new.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_nested_model_output_stays_float32():
    inner_in = keras.Input((4,))
    inner = keras.Model(
        inner_in,
        keras.layers.Dense(2, activation="softmax")(keras.layers.Dense(8)(inner_in)),
    )
    outer_in = keras.Input((4,))
    model = keras.Model(outer_in, inner(keras.layers.Dense(4)(outer_in)))
    model.compile(optimizer="sgd", loss="mse")
    precision_lib.apply(model, "mixed_bfloat16")
    assert model.predict(np.zeros((2, 4), "float32"), verbose=0).dtype == np.float32
    assert model.layers[1].dtype_policy.name == "mixed_bfloat16"
    assert inner.layers[-1].dtype_policy.name == "float32"  # the nested output


def test_sequential_model():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)]
    )
    model.compile(optimizer="sgd", loss="mse")
    precision_lib.apply(model, "mixed_bfloat16")
    assert [layer.dtype_policy.name for layer in model.layers] == [
        "mixed_bfloat16",
        "float32",
    ]


def test_custom_unregistered_loss_and_metric_objects_survive():
    def my_loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - y_pred))

    class MyMetric(keras.metrics.MeanSquaredError):
        pass

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss=my_loss, metrics=[MyMetric(name="m")])
    new = model_lib.recreate(model, "mixed_bfloat16", default_strategy())
    assert new.loss is my_loss
    assert isinstance(new.metrics[-1], keras.metrics.Metric)
    logs = new.evaluate(np.ones((4, 4)), np.ones((4, 1)), verbose=0, return_dict=True)
    assert "loss" in logs


def test_recreation_is_found_out_by_trying():
    class Net(keras.Model):
        def __init__(self, units):
            super().__init__()
            self.units = units
            self.d = keras.layers.Dense(units)

        def call(self, x):
            return self.d(x)

        def get_config(self):
            return {"units": self.units}

    class Opaque(keras.Model):
        def __init__(self, layer):  # a non-serialisable constructor argument
            super().__init__()
            self.d = layer

        def call(self, x):
            return self.d(x)

    assert recreation_problem(dense_model()) == ""
    assert recreation_problem(Net(3)) == ""
    assert "model Opaque" in recreation_problem(Opaque(keras.layers.Dense(2)))

    # A Functional model is not assumed re-creatable: each layer is tried.
    class NoKwargs(keras.layers.Layer):
        def __init__(self, units):
            super().__init__()
            self.d = keras.layers.Dense(units)

        def call(self, x):
            return self.d(x)

    inputs = keras.Input((3,))
    functional = keras.Model(inputs, NoKwargs(2)(inputs))
    why = recreation_problem(functional)
    assert "NoKwargs" in why and "TypeError" in why

    def plain_function(t):
        return t * 2

    inputs = keras.Input((3,))
    lam = keras.Model(inputs, keras.layers.Lambda(plain_function)(inputs))
    assert "Lambda" in recreation_problem(lam)


def test_a_layers_round_trip_is_tried_once_per_config(monkeypatch):
    """A notebook's repeated `fit` on one model: each layer's round trip is
    remembered by its config, and tried again when the config changes."""
    model = dense_model()
    made = []
    real = keras.layers.Dense.from_config.__func__

    def counted(cls, config):
        made.append(config["units"])
        return real(cls, config)

    monkeypatch.setattr(keras.layers.Dense, "from_config", classmethod(counted))
    assert recreation_problem(model) == ""
    first = len(made)
    assert first >= 1
    assert recreation_problem(model) == "" and len(made) == first
    model.get_layer("hidden").units += 1  # its config changes: tried again
    assert recreation_problem(model) == "" and len(made) == first + 1


def test_global_policy_context_restores_on_error():
    with pytest.raises(RuntimeError), model_lib.global_policy("mixed_bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        raise RuntimeError
    assert keras.config.dtype_policy().name == "float32"
