"""`ScaledLearningRate` and `BatchSearchResult.fit_kwargs` (issue 78): the
learning rate that goes with a larger batch, on TensorFlow;
tests_jax/test_jax_goodput.py runs the same checks on JAX."""

import dataclasses

import learning_rate_cases as cases
import pytest
from test_recompute import result

from kerascale.callbacks import ScaledLearningRate
from kerascale.errors import ConfigurationError
from kerascale.measure.result import BatchSearchResult


def test_adam_takes_the_square_root_and_gets_its_rate_back():
    cases.check_adam_takes_the_square_root_and_gets_its_rate_back()


def test_sgd_scales_linearly_over_its_warmup():
    cases.check_sgd_scales_linearly_over_its_warmup()


def test_reduce_on_plateau_acts_on_the_scaled_rate_and_stays():
    cases.check_reduce_on_plateau_acts_on_the_scaled_rate_and_stays()


def test_no_rule_or_a_schedule_leaves_the_rate_with_a_warning():
    cases.check_no_rule_or_a_schedule_leaves_the_rate_with_a_warning()


def test_a_fit_that_raises_gets_its_rate_back():
    cases.check_a_fit_that_raises_gets_its_rate_back()


def test_a_resume_restores_the_scaled_rate_not_its_square(tmp_path):
    cases.check_a_resume_restores_the_scaled_rate_not_its_square(tmp_path)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 64, "base_batch_size": -1}, "base_batch_size"),
        ({"batch_size": 64, "warmup_epochs": -2}, "warmup_epochs"),
        ({"batch_size": 64, "warmup_epochs": "1"}, "warmup_epochs"),
        ({"batch_size": 64, "verbose": 3}, "verbose"),
    ],
)
def test_arguments_are_checked_at_the_door(kwargs, name):
    with pytest.raises(ConfigurationError, match=name):
        ScaledLearningRate(**kwargs)


def answer(batch, samples, replicas=1):
    """A search's answer of `batch` (all replicas) on `samples` samples."""
    return dataclasses.replace(
        result(batch // replicas),
        batch_size=batch,
        replicas=replicas,
        samples=samples,
    )


def test_fit_kwargs_keep_an_epochs_updates_and_scale_the_rate():
    """The guide's case (issue 78): 2048 fits on 2,048 samples; the
    arguments train at 128 (16 updates an epoch) with the rate scaled."""
    mine = object()
    kwargs = answer(2048, 2048).fit_kwargs(callbacks=[mine])
    assert kwargs["batch_size"] == 128 and kwargs["precision"] == "float32"
    first, scale = kwargs["callbacks"]
    assert first is mine and isinstance(scale, ScaledLearningRate)
    assert (scale.batch_size, scale.base_batch_size) == (128, 32)
    one = ScaledLearningRate(64, verbose=0)  # a callback alone, not a list
    assert answer(32, 100).fit_kwargs(callbacks=one)["callbacks"] == [one]
    # Room for the answer: kept. Replicas: a multiple of them.
    assert answer(256, 100_000).fit_kwargs()["batch_size"] == 256
    assert answer(2048, 3000, replicas=3).fit_kwargs()["batch_size"] == 186


def test_fit_kwargs_add_no_scaling_at_or_below_the_base():
    assert answer(32, 100).fit_kwargs()["callbacks"] == []
    assert answer(24, None).fit_kwargs() == {
        "batch_size": 24,
        "precision": "float32",
        "callbacks": [],
    }
    assert answer(512, 100_000).fit_kwargs(base_batch_size=512)["callbacks"] == []
    with pytest.raises(ConfigurationError, match="min_updates"):
        answer(64, 100).fit_kwargs(min_updates=0)


def test_a_cached_answer_without_samples_reads_back():
    d = answer(64, 1000).to_dict()
    del d["samples"]
    assert BatchSearchResult.from_dict(d) == dataclasses.replace(
        answer(64, 1000), samples=None
    )
