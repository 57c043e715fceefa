"""Keras's words at the door (issue 81): what `model.fit` would refuse is
refused before anything is measured, of Keras's type and with Keras's text,
under a traceback of the user's line; what `model.fit` accepts is accepted;
a model with its own `fit` keeps its own checks."""

import sys
import traceback
import warnings

import keras
import numpy as np
import pytest

import kerascale
from kerascale.measure import decide as decide_lib


def compiled_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def data(n=64):
    rng = np.random.default_rng(0)
    return rng.random((n, 4), dtype="float32"), rng.random((n, 1), dtype="float32")


@pytest.fixture
def nothing_measured(monkeypatch):
    """Fails a test whose door reaches the decision."""

    def decided(*args, **kwargs):
        raise AssertionError("the door decided before it checked the arguments")

    monkeypatch.setattr(decide_lib, "decide", decided)
    monkeypatch.setattr(sys.modules["kerascale.fit"], "decide", decided)


def raised(call):
    """(the error `call()` raises, its traceback's lines)."""
    try:
        call()
    except Exception as e:
        return e, len(traceback.format_exc().splitlines())
    raise AssertionError("it did not raise")


def test_a_misspelt_keyword_fails_first_with_the_nearest_name(nothing_measured):
    x, y = data()
    plain, _ = raised(lambda: compiled_model().fit(x, y, validaton_split=0.2))
    e, lines = raised(
        lambda: kerascale.fit(compiled_model(), x, y, validaton_split=0.2)
    )
    assert type(e) is type(plain) is TypeError
    assert "got an unexpected keyword argument 'validaton_split'" in str(plain)
    assert str(e) == (
        "kerascale.fit() got an unexpected keyword argument 'validaton_split'; "
        "did you mean 'validation_split'?"
    )
    assert lines <= 12, traceback.format_exception(e)
    # kerascale's own options are among the names it suggests, and plan's
    # door names itself.
    e, _ = raised(lambda: kerascale.plan(compiled_model(), x, y, memroy_limit="1GiB"))
    assert "kerascale.plan() got an unexpected keyword argument 'memroy_limit'" in str(
        e
    )
    assert "did you mean 'memory_limit'?" in str(e)


@pytest.mark.parametrize("name, value", [("epochs", "3"), ("epochs", 2.0),
                                         ("initial_epoch", "1"),
                                         ("steps_per_epoch", 2.5)])  # fmt: skip
def test_a_count_keras_cannot_read_fails_first_in_keras_s_words(
    nothing_measured, name, value
):
    x, y = data()
    kwargs = {name: value, "verbose": 0}
    plain, plain_lines = raised(lambda: compiled_model().fit(x, y, **kwargs))
    e, lines = raised(lambda: kerascale.fit(compiled_model(), x, y, **kwargs))
    assert type(e) is type(plain) is TypeError
    assert str(plain) in str(e) and f"{name}={value!r}" in str(e)
    assert lines <= plain_lines + 10


def test_mismatched_arrays_fail_in_keras_s_words_under_a_short_traceback():
    x, y = data()
    plain, plain_lines = raised(lambda: compiled_model().fit(x, y[:-1], verbose=0))
    e, lines = raised(lambda: kerascale.fit(compiled_model(), x, y[:-1], verbose=0))
    assert isinstance(e, type(plain)) and isinstance(e, kerascale.DataError)
    keras_words = str(plain).split("'x' sizes")[0]  # Keras's sentence
    assert str(e).startswith(keras_words), (str(e), str(plain))
    assert str(e).endswith("'x' sizes: 64, 'y' sizes: 63")  # numbers, not lists
    assert lines <= plain_lines + 10, traceback.format_exception(e)


def test_an_uncompiled_model_fails_in_keras_s_words():
    x, y = data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    plain, plain_lines = raised(lambda: model.fit(x, y, verbose=0))
    e, lines = raised(lambda: kerascale.fit(model, x, y, verbose=0))
    assert isinstance(e, type(plain)) and str(e) == str(plain)
    assert lines <= plain_lines + 10


@pytest.mark.parametrize("batch_size", [None, 0])
def test_batch_size_none_or_0_is_keras_s_own_choice(batch_size):
    """Keras's fit takes None or 0 as its own batch: 32 for arrays, or one
    that covers them in steps_per_epoch steps; a dataset's own batch."""
    import tensorflow as tf

    x, y = data(256)
    history = kerascale.fit(compiled_model(), x, y, batch_size=batch_size, verbose=0)
    assert history.plan.global_batch_size == 32
    history = kerascale.fit(
        compiled_model(), x, y, batch_size=batch_size, steps_per_epoch=4, verbose=0
    )
    assert history.plan.global_batch_size == 64
    # Keras counts the samples it trains on, after validation_split.
    kwargs = {"steps_per_epoch": 4, "validation_split": 0.25, "verbose": 0}
    plain = compiled_model().fit(x, y, batch_size=batch_size, **kwargs)
    history = kerascale.fit(compiled_model(), x, y, batch_size=batch_size, **kwargs)
    assert history.plan.global_batch_size == 48  # 192 samples in 4 steps
    assert plain.params["steps"] == 4
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = kerascale.fit(compiled_model(), ds, batch_size=batch_size, verbose=0)
    assert history.plan.global_batch_size == 16


class OwnFit(keras.Sequential):
    """A model class with its own fit, as keras-hub's tasks have: its own
    check first, then Keras's fit."""

    def fit(self, x=None, y=None, **kwargs):
        if y is not None and len(x) != len(y):
            raise ValueError("OwnFit: x and y differ in length (its own words)")
        return super().fit(x, y, **kwargs)


def test_a_model_with_its_own_fit_keeps_its_own_checks_and_errors():
    x, y = data()
    model = OwnFit([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"^OwnFit: x and y differ"):
            kerascale.fit(model, x, y[:-1], verbose=0)
    said = [str(w.message) for w in said if "own fit" in str(w.message)]
    assert len(said) == 1 and "OwnFit has its own fit" in said[0], said
    # Its fit takes **kwargs: the names are those of Keras's fit above it.
    with pytest.raises(TypeError, match="did you mean 'validation_split'"):
        kerascale.fit(model, x, y, validaton_split=0.2)
    assert kerascale.fit(model, x, y, epochs=1, verbose=0).plan is not None


def test_every_argument_of_keras_s_fit_is_accepted():
    """README: "Whatever `model.fit` accepts, `kerascale.fit` accepts." Each
    argument of the installed Keras's `fit`, walked from its signature (one
    Keras adds is walked too, at its default), trains as with `model.fit`."""
    import inspect

    x, y = data(64)
    chosen = {
        "batch_size": 16,
        "epochs": 2,
        "verbose": 0,
        "callbacks": [keras.callbacks.TerminateOnNaN()],
        "validation_split": 0.25,
        "validation_data": (x[:8], y[:8]),
        "shuffle": False,
        "sample_weight": np.ones(64, "float32"),
        "initial_epoch": 1,
        "steps_per_epoch": 2,
        "validation_steps": 1,
        "validation_batch_size": 4,
        "validation_freq": 2,
    }
    walked = []
    for name, p in inspect.signature(compiled_model().fit).parameters.items():
        if name in ("x", "y") or p.kind is p.VAR_KEYWORD:
            continue
        value = chosen.get(name, p.default)
        assert value is not p.empty, f"Keras's fit has a new required {name}"
        kwargs = {"epochs": 2, "verbose": 0, name: value}
        if name.startswith("validation_") and name != "validation_data":
            kwargs["validation_data"] = (x[:8], y[:8])
        plain = compiled_model().fit(x, y, **kwargs)
        ours = kerascale.fit(compiled_model(), x, y, **kwargs)
        assert ours.epoch == plain.epoch, name
        assert set(ours.history) == set(plain.history), name
        walked.append(name)
    assert {"class_weight", "validation_freq", "shuffle"} <= set(walked)


def test_the_options_are_declared_once_in_fits_signature(monkeypatch):
    """Issue 82: `fit`'s keyword-only parameters are the options; `plan`
    takes `fit`'s signature as its own, and the door reads each option by
    that name (an option given to `plan` reaches the validation, one left
    out gets `fit`'s default, and the rest goes to Keras's fit)."""
    import inspect

    fit_module = sys.modules["kerascale.fit"]
    ours = inspect.signature(kerascale.fit).parameters
    theirs = inspect.signature(kerascale.plan).parameters
    assert list(theirs) == list(ours) and theirs == ours
    seen = {}

    def validate(**options):
        seen.update(options)
        raise kerascale.ConfigurationError("stop here")

    monkeypatch.setattr(fit_module._Request, "validate", validate)
    x, y = data()
    with pytest.raises(kerascale.ConfigurationError, match="stop here"):
        kerascale.plan(compiled_model(), x, y, precision="float32", epochs=3)
    assert set(seen) == set(fit_module._FIT_OPTIONS) and len(seen) == 22
    assert seen["precision"] == "float32" and seen["strategy"] == "auto"
    assert "epochs" not in seen


def test_what_a_decision_starts_from_is_gathered_by_named_steps(monkeypatch):
    """Issue 82: `_Deciding` is a record (making one does nothing else);
    `_deciding` takes the door's steps (materialize, sense, join, back up,
    inspect), each once, in that order."""
    import dataclasses

    fit_module = sys.modules["kerascale.fit"]
    assert dataclasses.is_dataclass(fit_module._Deciding)
    order = []

    def step(name, real):
        def called(*args, **kwargs):
            order.append(name)
            return real(*args, **kwargs)

        return called

    for name, owner, attribute in (
        ("materialize", fit_module.materialize_lib, "materialized_input"),
        ("sense", fit_module.hardware_lib, "detect_hardware"),
        ("join", fit_module.cluster, "join_if_wanted"),
        ("back up", fit_module.fit_callbacks, "backup_for"),
    ):
        monkeypatch.setattr(owner, attribute, step(name, getattr(owner, attribute)))
    x, y = data()
    kerascale.plan(compiled_model(), x, y, verbose=0)
    assert order == ["materialize", "sense", "join", "back up"]
