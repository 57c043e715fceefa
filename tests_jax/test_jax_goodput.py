"""The gradient noise scale measured on JAX (issue 78); the pure parts and
TensorFlow's are tests/test_goodput.py."""

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
