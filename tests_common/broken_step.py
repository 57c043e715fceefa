"""A step broken on its own, through `kerascale.fit`, on both backends (tests/
test_dropin.py and tests_jax/test_jax_fit.py): the retry holds its warnings
until a step has run, so the user gets the error plain `fit` raises, with no
warning that blames kerascale's choices, and each of the plan's warnings once."""

import warnings

import conformance
import keras
import pytest

import kerascale

KINDS = ["arrays", "pydataset", "generator", "grain"]
MESSAGE = "my train_step is broken"


def check(kind: str, broken_class: type) -> None:
    """`broken_class`: a `keras.Model` whose `train_step` raises MESSAGE."""

    def broken():  # a fresh one each: on JAX a failed fit leaves it unusable
        inputs = keras.Input((conformance.FEATURES,))
        model = broken_class(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
        return model

    x, y, kwargs = conformance.make_input(kind)
    with pytest.raises(ValueError, match=MESSAGE):
        broken().fit(x, y, verbose=0, **kwargs)
    x, y, kwargs = conformance.make_input(kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=MESSAGE):
            kerascale.fit(broken(), x, y, verbose=0, **kwargs)
    said = [str(w.message) for w in caught if w.category is kerascale.KerascaleWarning]
    assert not [w for w in said if "failed" in w], said
    assert len(said) == len(set(said)), said
