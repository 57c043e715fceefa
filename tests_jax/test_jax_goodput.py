"""The gradient noise scale measured on JAX (issue 78); the pure parts and
TensorFlow's are tests/test_goodput.py."""

import learning_rate_cases
import noise_cases
import numpy as np
import pytest


# Keras's side: its train step's loss and gradients (CONTRIBUTING.md).
@pytest.mark.nightly
def test_the_measured_noise_scale_of_a_linear_model_is_the_analytic_one():
    model, x, y, truth = noise_cases.linear_case()
    measured = noise_cases.measured_noise_scale(model, x, y)
    assert measured == pytest.approx(truth, rel=0.15), (measured, truth)


# Keras's side: its train step's loss and gradients (CONTRIBUTING.md).
@pytest.mark.nightly
def test_a_noise_sample_leaves_no_trace_in_training():
    plain = noise_cases.trained_weights(measure=False)
    measured = noise_cases.trained_weights(measure=True)
    for a, b in zip(plain, measured, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_callback_records_the_noise_scale_in_model_fit_and_kerascale_fit():
    """On 1 device, and on 2 in the 2-device lane: `kerascale.fit` trains
    data-parallel there, the variables replicated."""
    import kerascale

    noise, history, truth = noise_cases.callback_run(
        lambda model, *a, **k: model.fit(*a, **k)
    )
    noise_cases.check_callback_run(noise, history, truth)
    noise, history, truth = noise_cases.callback_run(kerascale.fit)
    noise_cases.check_callback_run(noise, history, truth)
    import jax

    assert history.plan.replicas == len(jax.devices()), history.plan.explain()


# ScaledLearningRate's checks (tests/test_scaled_learning_rate.py on TF).
@pytest.mark.parametrize(
    "check",
    [
        "check_adam_takes_the_square_root_and_gets_its_rate_back",
        "check_sgd_scales_linearly_over_its_warmup",
        "check_reduce_on_plateau_acts_on_the_scaled_rate_and_stays",
        "check_no_rule_or_a_schedule_leaves_the_rate_with_a_warning",
        "check_a_fit_that_raises_gets_its_rate_back",
    ],
)
def test_scaled_learning_rate(check):
    getattr(learning_rate_cases, check)()


def test_scaled_learning_rate_resumes_scaled_once(tmp_path):
    learning_rate_cases.check_a_resume_restores_the_scaled_rate_not_its_square(tmp_path)
