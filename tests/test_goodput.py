"""The batch that trains best per second (issue 78): the gradient noise
scale, statistical efficiency, goodput, and the learning-rate rule of each
Keras optimizer. The measurement's TensorFlow half; tests_jax/test_jax_goodput.py
is JAX's."""

import math

import keras
import noise_cases
import numpy as np
import pytest

from kerascale.apply import gradient_noise
from kerascale.plan import goodput
from kerascale.plan.goodput import NoiseSample, NoiseScale


def test_the_two_batch_estimates_are_unbiased_on_known_gradients():
    """Per-sample gradients drawn from N(G, Sigma) with G and Sigma known:
    averaged over many draws, |G|^2 and tr(Sigma) come out right, and so
    does B_noise (McCandlish et al., appendix A)."""
    rng = np.random.default_rng(0)
    dim, small, parts = 6, 4, 8
    g = rng.normal(size=dim)
    scales = rng.uniform(0.5, 3.0, size=dim)  # Sigma = diag(scales^2)
    gradient_sq, trace = [], []
    for _ in range(4000):
        per_sample = g + rng.normal(size=(small * parts, dim)) * scales
        micro = per_sample.reshape(parts, small, dim).mean(axis=1)
        s = NoiseSample(
            small,
            float(np.mean(np.sum(micro**2, axis=1))),
            small * parts,
            float(np.sum(micro.mean(axis=0) ** 2)),
        )
        gradient_sq.append(s.gradient_sq)
        trace.append(s.trace)
    assert np.mean(gradient_sq) == pytest.approx(g @ g, rel=0.05)
    assert np.mean(trace) == pytest.approx(np.sum(scales**2), rel=0.05)


def test_the_noise_scale_averages_its_estimates_apart_and_waits_for_a_gradient():
    scale = NoiseScale(smoothing=0.5)
    assert scale.value is None
    # |G|^2 estimated below zero: the noise swamps the gradient, no value yet.
    scale.add(NoiseSample(8, 1.0, 64, 0.1))
    assert scale.samples == 1 and scale.value is None
    scale.add(NoiseSample(8, 2.0, 64, 1.5))
    first = NoiseSample(8, 1.0, 64, 0.1)
    second = NoiseSample(8, 2.0, 64, 1.5)
    g2 = 0.5 * first.gradient_sq + 0.5 * second.gradient_sq
    tr = 0.5 * first.trace + 0.5 * second.trace
    assert g2 > 0
    assert scale.value == pytest.approx(tr / g2)
    scale.add(NoiseSample(8, math.inf, 64, 1.0))  # an overflowed gradient
    assert scale.samples == 2


@pytest.mark.parametrize(
    "small, big", [(0, 8), (8, 8), (16, 8)], ids=["zero", "equal", "reversed"]
)
def test_a_noise_sample_needs_two_batch_sizes(small, big):
    with pytest.raises(ValueError, match=f"small={small}, big={big}"):
        NoiseSample(small, 1.0, big, 0.5)


def test_goodput_chooses_where_throughput_outruns_the_lost_efficiency():
    """At noise scale 100, batch 128 trains fastest per second to a loss,
    though 2000 has 20x the samples per second: each of its samples is
    worth (100 + 32) / (100 + 2000) = 0.063 of one at 32."""
    speeds = {32: 1000.0, 64: 1900.0, 128: 3400.0, 256: 5000.0, 2000: 20000.0}
    choice = goodput.choose(speeds, base=32, noise=100.0)
    assert choice.batch == 128
    assert choice.goodput[2000] == pytest.approx(20000 * 132 / 2100)
    assert choice.gain == pytest.approx(3400 * 132 / 228 / 1000)
    # Where the noise scale is large, the largest batch is worth its speed.
    assert goodput.choose(speeds, base=32, noise=1e6).batch == 2000
    # Where it is small, Keras's batch is kept.
    assert goodput.choose(speeds, base=32, noise=1.0).batch == 32


def test_a_larger_batch_must_beat_the_smaller_by_more_than_the_timing_spread():
    speeds = {32: 1000.0, 64: 2000.0}
    noise = (64 * 1.02 - 2 * 32) / (2 - 1.02)
    assert goodput.choose(speeds, 32, noise).gain == 1.0
    assert goodput.choose(speeds, 32, noise, tolerance=0.01).batch == 64


def test_choose_validates_its_inputs():
    with pytest.raises(ValueError, match="at least one batch"):
        goodput.choose({}, base=32, noise=1.0)
    with pytest.raises(ValueError, match="Received: nan"):
        goodput.choose({32: 1.0}, base=32, noise=float("nan"))


def test_every_keras_optimizer_has_a_rule_or_is_named_as_keeping_its_batch():
    """A Keras optimizer added upstream fails here until it is classified."""
    names = {
        n
        for n in dir(keras.optimizers)
        if isinstance(getattr(keras.optimizers, n), type)
        and issubclass(getattr(keras.optimizers, n), keras.optimizers.Optimizer)
    } - {"Optimizer", "LossScaleOptimizer"}
    assert names <= set(goodput.RULES) | set(goodput.NO_RULE), (
        names - set(goodput.RULES) - set(goodput.NO_RULE)
    )


def test_each_family_gets_its_rule():
    sgd = goodput.rule_of(keras.optimizers.SGD(0.1, momentum=0.9))
    assert (sgd.scaling, sgd.warmup) == ("linear", True)
    assert sgd.factor(256, 32) == 8
    adam = goodput.rule_of(keras.optimizers.AdamW(1e-3))
    assert (adam.scaling, adam.warmup) == ("sqrt", False)
    assert adam.factor(128, 32) == 2
    wrapped = keras.optimizers.LossScaleOptimizer(keras.optimizers.RMSprop())
    assert goodput.rule_of(wrapped) is goodput.SQRT
    assert goodput.rule_of(keras.optimizers.Lion()) is None

    class MyAdam(keras.optimizers.Adam):
        pass

    assert goodput.rule_of(MyAdam()) is goodput.SQRT


# Keras's side: its train step's loss and gradients (CONTRIBUTING.md).
@pytest.mark.nightly
def test_the_measured_noise_scale_of_a_linear_model_is_the_analytic_one():
    model, x, y, truth = noise_cases.linear_case()
    measured = noise_cases.measured_noise_scale(model, x, y)
    assert measured == pytest.approx(truth, rel=0.15), (measured, truth)


# Keras's side: its train step's loss and gradients (CONTRIBUTING.md).
@pytest.mark.nightly
def test_a_noise_sample_leaves_no_trace_in_training():
    """The same seed trains the same weights whether or not a sample was
    taken: batch statistics, the dropout's seed and the loss tracker are
    put back."""
    plain = noise_cases.trained_weights(measure=False)
    measured = noise_cases.trained_weights(measure=True)
    for a, b in zip(plain, measured, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_noise_sample_names_what_it_needs():
    model, x, y, _ = noise_cases.linear_case(samples=100)
    with pytest.raises(ValueError, match="needs 128 samples; x has 100"):
        gradient_noise.sample(model, x, y, small=16, parts=8)
    with pytest.raises(
        ValueError, match=r"parts must be an int >= 2\. Received: parts=1"
    ):
        gradient_noise.sample(model, x, y, small=16, parts=1)
    with pytest.raises(ValueError, match=r"small must be an int >= 1\. .*small=True"):
        gradient_noise.sample(model, x, y, small=True)


def test_the_callback_records_the_noise_scale_in_model_fit_and_kerascale_fit():
    import kerascale

    noise, history, truth = noise_cases.callback_run(
        lambda model, *a, **k: model.fit(*a, **k)
    )
    noise_cases.check_callback_run(noise, history, truth)
    noise, history, truth = noise_cases.callback_run(kerascale.fit)
    noise_cases.check_callback_run(noise, history, truth)


# Keras's side: its train step's loss and gradients (CONTRIBUTING.md).
@pytest.mark.nightly
def test_the_callback_leaves_no_trace_in_training():
    """The same weights as a run without it, dropout and batch statistics
    included."""
    import kerascale

    def run(with_callback):
        model, x, y = noise_cases.model_with_state()
        extra = [kerascale.callbacks.NoiseScale(x, y, small=16, parts=4)]
        model.fit(
            x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
            callbacks=extra if with_callback else [],
        )  # fmt: skip
        return [np.asarray(w) for w in model.variables]

    for a, b in zip(run(False), run(True), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"small": 0}, "small must be a positive int. Received: small=0"),
        ({"parts": 1}, "parts must be an int >= 2. Received: parts=1"),
        ({"every": True}, "every must be a positive int. Received: every=True"),
        ({"smoothing": 1.0}, r"smoothing must be a number in \[0, 1\)"),
        ({"in_logs": "yes"}, "in_logs must be"),
        (
            {"small": 64, "parts": 8},
            "at least small \\* parts = 512 samples. Received: 100",
        ),
    ],
)
def test_the_callback_validates_its_arguments(kwargs, message):
    import kerascale
    from kerascale.errors import ConfigurationError

    x = np.zeros((100, 4), "float32")
    with pytest.raises(ConfigurationError, match=message):
        kerascale.callbacks.NoiseScale(x, np.zeros((100, 1)), **kwargs)


def test_the_callback_names_data_that_is_not_arrays_or_does_not_match():
    import kerascale
    from kerascale.errors import ConfigurationError

    x = np.zeros((100, 4), "float32")
    with pytest.raises(ConfigurationError, match="y must have as many samples as x"):
        kerascale.callbacks.NoiseScale(x, np.zeros((99, 1)))
    with pytest.raises(ConfigurationError, match="x must be arrays"):
        kerascale.callbacks.NoiseScale(iter([x]))
    with pytest.raises(ConfigurationError, match="x's arrays must have one length"):
        kerascale.callbacks.NoiseScale({"a": x, "b": x[:50]})


def test_the_callback_survives_a_deep_copy_and_a_second_fit():
    """keras-tuner copies callbacks per trial; one instance serves several
    fits, each from a fresh average."""
    import copy

    noise, _, _ = noise_cases.callback_run(lambda model, *a, **k: model.fit(*a, **k))
    clone = copy.deepcopy(noise)
    assert clone.epochs_seen == noise.epochs_seen
    model, x, y, _ = noise_cases.linear_case(samples=4096)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[noise])
    assert [e["epoch"] for e in noise.epochs_seen] == [0]


# --- Growing the batch inside the run (goodput.grow, EpochTimes) ---------------


def _grow(current, noise, seconds, **kwargs):
    options = {"ceiling": 1024, "remaining_samples": 10**6, "switch_seconds": 0.0}
    return goodput.grow(current, 32, noise, seconds, **{**options, **kwargs})


def test_growth_waits_for_a_noise_scale():
    growth = _grow(32, None, {32: 1e-3})
    assert growth.batch == 32 and "no noise scale" in growth.why


def test_growth_doubles_where_the_predicted_goodput_pays():
    # One batch timed: a doubling's step is predicted sqrt(2) longer, so
    # its samples/s is x sqrt(2); at a noise scale of 1000 efficiency barely
    # falls.
    growth = _grow(32, 1000.0, {32: 1e-3})
    assert growth.batch == 64 and growth.predicted == 64
    assert growth.speeds[64] == pytest.approx(64 / (1e-3 * math.sqrt(2)))
    assert growth.gain == pytest.approx(math.sqrt(2) * (1032 / 1064), rel=1e-6)


def test_growth_stays_where_the_noise_scale_is_below_the_batch():
    # Noise scale 8: doubling halves the efficiency, and sqrt(2) speed
    # does not make it up.
    assert _grow(32, 8.0, {32: 1e-3}).batch == 32


def test_growth_predicts_from_the_line_through_two_timed_batches():
    # 32 at 1 ms, 64 at 1.5 ms: 128 predicted at 2.5 ms, 1.2x 64's
    # samples/s.
    growth = _grow(64, 10_000.0, {32: 1e-3, 64: 1.5e-3})
    assert growth.predicted == 128
    assert growth.speeds[128] == pytest.approx(128 / 2.5e-3)
    assert growth.batch == 128


def test_growth_stays_where_goodput_is_best():
    # 64 timed at 1.2 ms, 128 predicted at 1.6 ms: 128's x1.5 samples/s is
    # lost to efficiency at a noise scale of 64.
    growth = _grow(64, 64.0, {32: 1e-3, 64: 1.2e-3})
    assert growth.batch == 64 and growth.why == "goodput is best here"


def test_growth_goes_back_to_a_timed_batch_that_was_faster():
    # 64 was predicted faster and timed slower than 32.
    growth = _grow(64, 1000.0, {32: 1e-3, 64: 3e-3})
    assert growth.batch == 32


def test_growth_to_an_untimed_batch_must_save_more_than_it_costs():
    seconds = {32: 1e-3}
    # Saving over 3,200 samples: 100 steps of 1 ms -> 50 steps of 1.41 ms.
    assert _grow(32, 1e6, seconds, remaining_samples=3200, switch_seconds=0.5).why
    assert (
        _grow(32, 1e6, seconds, remaining_samples=10**6, switch_seconds=0.5).batch == 64
    )


def test_growth_may_reach_several_doublings_at_once():
    # A step all overhead (64 samples cost nothing more): 256 is predicted
    # at 32's step, and at a noise scale of 10,000 it wins; one doubling
    # only where the rule allows one.
    seconds = {32: 1e-3}
    growth = _grow(32, 10_000.0, seconds, doublings=3, compute_seconds=0.0)
    assert growth.batch == 256 and growth.predicted == 256
    assert _grow(32, 10_000.0, seconds, compute_seconds=0.0).batch == 64
    # Capped by the ceiling.
    assert _grow(32, 1e4, seconds, doublings=3, ceiling=128).batch == 128
    # Noise scale 64: goodput 32,000, 48,000, 64,000, 76,800 at 32-256 on
    # a step all overhead; where every 32 samples add a step's time, the
    # speed is flat and the efficiency lost keeps 32.
    assert _grow(32, 64.0, seconds, doublings=3, compute_seconds=0.0).batch == 256
    spread = _grow(32, 64.0, seconds, doublings=3, compute_seconds=1e-3)
    assert spread.batch == 32 and spread.predicted == 64


def test_growth_stays_under_the_ceiling():
    assert _grow(32, 1e6, {32: 1e-3}, ceiling=63).batch == 32


def test_growth_needs_the_current_batch_timed():
    with pytest.raises(ValueError, match="must time the current batch 64"):
        _grow(64, 100.0, {32: 1e-3})


def test_a_run_that_left_its_base_counts_goodput_at_it_from_the_batches_timed():
    # 256 timed (the run moved there at its first epoch's end, its base's
    # step then at another steps per call, not kept): goodput is still
    # counted at 32, and the choice is among the batches timed and the next.
    flat = _grow(256, 1e4, {256: 1e-3}, compute_seconds=0.0)
    assert flat.batch == 512
    choice = goodput.choose({256: 256e3, 512: 300e3}, base=32, noise=100.0)
    assert choice.batch == 256 and choice.gain == 1.0
    assert choice.goodput[256] == pytest.approx(256e3 * 132 / 356)


def test_epoch_times_take_a_batch_s_steady_step_from_its_later_epochs():
    from kerascale.apply.batch_growth import EpochTimes

    times = EpochTimes()
    # Base: 100 steps; the first epoch 0.9 s (compiling), then 0.15 s.
    times.add(32, 0.9, 100)
    assert not times.settled(32) and times.steady() == {}
    assert times.switch_seconds() == 0.0  # not known before a second epoch
    times.add(32, 0.15, 100)
    assert times.settled(32) and times.steady() == {32: pytest.approx(1.5e-3)}
    assert times.switch_seconds() == pytest.approx(0.9 - 0.15)
    # A new batch: its first epoch is not its steady time; the fastest later
    # epoch is (a busy machine only slows one).
    times.add(64, 1.5, 50)
    assert not times.settled(64) and 64 not in times.steady()
    times.add(64, 0.14, 50)
    times.add(64, 0.12, 50)
    assert times.settled(64)
    assert times.steady()[64] == pytest.approx(0.12 / 50)
    assert times.switch_seconds() == pytest.approx(1.5 - 0.12)
    assert times.seconds() == pytest.approx(0.9 + 0.15 + 1.5 + 0.14 + 0.12)
    # The steps per call moved at 64: its epochs before are dropped, and its
    # first still counts as what a new batch costs.
    times.moved(64)
    assert 64 not in times.epochs and times.switch_seconds() == pytest.approx(
        1.5 - 0.15
    )
    times.add(64, 0.05, 50)
    assert times.switch_seconds() == pytest.approx(1.5 - 0.05)
    # An epoch of too few steps is not timed.
    times.add(128, 0.1, 3)
    times.add(128, 0.1, 3)
    assert 128 not in times.steady()


def test_growth_predicts_a_doubling_from_the_measured_passes():
    # 32 at 1 ms a step; 32 more samples add 0.25 ms of passes: 64 predicted
    # at 1.25 ms, x1.6 the samples/s.
    growth = _grow(32, 1e6, {32: 1e-3}, compute_seconds=0.25e-3)
    assert growth.speeds[64] == pytest.approx(64 / 1.25e-3)
    assert growth.batch == 64
    # Passes as long as the step (all compute): no faster, the batch stays.
    assert _grow(32, 1e6, {32: 1e-3}, compute_seconds=1e-3).batch == 32
