"""The steps per call chosen inside the run (`apply.steps_in_run`, issue
79): its decisions from epochs timed on a scripted clock (the seam), with
no Keras run. tests_common/steps_per_call.py checks it in real runs on
both backends."""

import pytest

from kerascale.apply import steps_in_run
from kerascale.apply.steps_in_run import Bounds, StepsInRun
from kerascale.plan import reasons as reasons_lib
from kerascale.plan import steps as steps_rules


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def lever(cap=64, why="a quarter of an epoch", limit=None, backend="tensorflow"):
    clock = Clock()
    bounds = Bounds(cap, why, limit or steps_rules.StepsLimit())
    return StepsInRun(bounds, backend, clock=clock), clock


def epoch(lever, clock, *, steps, per_step, first=0.4, epochs=30, validation=0.0):
    """One epoch of `steps` at the lever's value: a first call of `first`
    seconds, then `per_step` a step; a validation whose first call takes
    `validation` more."""
    lever.set_params({"epochs": epochs, "steps": steps})
    n = lever.n
    lever.on_epoch_begin(0)
    clock.t += first + n * per_step
    lever.on_train_batch_end(n - 1)
    clock.t += (steps - n) * per_step
    if validation:
        lever.on_test_begin()
        clock.t += validation
        lever.on_test_batch_end(0)
    lever.on_epoch_end(0)


def test_a_short_step_moves_to_the_bound_then_keeps_it_where_faster():
    ours, clock = lever()
    epoch(ours, clock, steps=256, per_step=0.0008)
    assert ours.propose(0, {}) == {"steps_per_execution": 64}
    ours.n = 64  # what `changed` sets (with the model's value)
    epoch(ours, clock, steps=256, per_step=0.0003, validation=0.3)
    assert ours.propose(1, {}) is None
    n, why = ours.outcome()
    assert n == 64 and reasons_lib.code(why) == "steps.run_measured"
    # (0.8 - 0.3) * 64/63 of 0.8 ms: the host path's share at one a call.
    assert "63% of a step" in why and "0.80 ms a step at 1" in why
    assert "a quarter of an epoch" in why
    assert ours.propose(2, {}) is None  # decided once


def test_a_value_slower_than_one_goes_back():
    ours, clock = lever()
    epoch(ours, clock, steps=256, per_step=0.0008)
    assert ours.propose(0, {}) == {"steps_per_execution": 64}
    ours.n = 64
    epoch(ours, clock, steps=256, per_step=0.0008 * (1 + 2 * steps_in_run.TOLERANCE))
    assert ours.propose(1, {}) == {"steps_per_execution": 1}
    ours.n = 1
    n, why = ours.outcome()
    assert n == 1 and reasons_lib.code(why) == "steps.run_back"


def test_a_long_step_keeps_one_a_call():
    """A CNN's step of tens of milliseconds: the host path is too small a
    share to move for (nothing traces again; the run is plain fit's)."""
    ours, clock = lever()
    epoch(ours, clock, steps=32, per_step=0.03, epochs=3)
    assert ours.propose(0, {}) is None
    n, why = ours.outcome()
    assert n == 1 and reasons_lib.code(why) == "steps.run_not_worth"
    assert "30.00 ms" in why


def test_a_run_too_short_to_repay_a_trace_keeps_one_a_call():
    ours, clock = lever()
    epoch(ours, clock, steps=40, per_step=0.0008, first=0.5, epochs=2)
    assert ours.propose(0, {}) is None
    n, why = ours.outcome()
    assert n == 1 and reasons_lib.code(why) == "steps.run_unpaid"


def test_a_call_stays_under_a_second():
    ours, clock = lever(cap=128, why="at most 128")
    epoch(ours, clock, steps=10_000, per_step=0.009)
    k = ours.propose(0, {})["steps_per_execution"]
    assert k == int(steps_rules.MAX_CALL_SECONDS / 0.009) == 111


def test_the_value_lands_on_the_steps_a_callback_names():
    limit = steps_rules.StepsLimit().dividing(100, "checkpoint_freq=100")
    ours, clock = lever(limit=limit)
    epoch(ours, clock, steps=256, per_step=0.0008)
    assert ours.propose(0, {}) == {"steps_per_execution": 50}
    assert "checkpoint_freq=100" in ours._why


def test_an_epoch_too_short_to_time_asks_nothing():
    ours, clock = lever()
    epoch(ours, clock, steps=steps_in_run.TIMED_STEPS, per_step=0.0008)
    assert ours.propose(0, {}) is None
    n, why = ours.outcome()
    assert n == 1 and reasons_lib.code(why) == "steps.run_short"


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_prior_is_the_backends(backend):
    ours, _ = lever(backend=backend)
    assert ours.prior == steps_in_run.HOST_PRIOR[backend]


def test_would_move_answers_what_the_first_epoch_s_end_will_propose():
    """The batch lever asks before the steps lever's `propose` (to join its
    move): the answer is that move, and asking changes nothing."""
    ours, clock = lever()
    epoch(ours, clock, steps=256, per_step=0.0008)
    assert ours.would_move(0) == 64 and ours.would_move(0) == 64
    assert ours.proposed is None and not ours.done
    assert ours.propose(0, {}) == {"steps_per_execution": 64}
    assert ours.proposed == 64 and ours.would_move(0) == 64  # the batch joins
    ours.n = 64  # what `changed` sets
    assert ours.would_move(1) is None  # it moves from one once
    short, clock = lever()
    epoch(short, clock, steps=40, per_step=0.0008, first=0.5, epochs=2)
    assert short.would_move(0) is None and short.propose(0, {}) is None


def test_a_training_step_and_its_trace_leave_the_validation_out():
    ours, clock = lever()
    epoch(ours, clock, steps=101, per_step=0.001, first=0.2)
    ours.on_test_begin()
    clock.t += 0.05  # a first validation call of 50 ms
    ours.on_test_batch_end(0)
    clock.t += 0.3  # the validation's other calls
    ours.on_test_end()
    ours.on_epoch_end(0)  # the epoch's end again, after its validation
    timed = ours.epochs[-1]
    assert timed.validation == pytest.approx(0.3)
    # The first calls' excess: the training's (its trace) and the
    # validation's; a new batch's shape costs the training's alone.
    assert timed.train_excess == pytest.approx(0.2)
    assert timed.first_excess == pytest.approx(0.2 + 0.05 - 0.001)
    assert timed.training_step == pytest.approx(0.001)
    assert timed.per_step == pytest.approx(0.001 + 0.3 / 100)


def test_a_batch_moved_with_the_steps_is_checked_against_a_step_at_it():
    """The batch grew with the move to 64 a call: a step there is longer
    than at one a call at the old batch, though the move paid. Rebased by
    what the larger batch adds, the check keeps 64."""
    ours, clock = lever()
    epoch(ours, clock, steps=256, per_step=0.0008)
    assert ours.propose(0, {}) == {"steps_per_execution": 64}
    ours.n = 64
    ours.rebased(0.0012)  # at one a call the new batch takes 2 ms a step
    epoch(ours, clock, steps=640, per_step=0.0015)
    assert ours.propose(1, {}) is None
    n, why = ours.outcome()
    assert n == 64 and reasons_lib.code(why) == "steps.run_measured"
    again, clock = lever()  # not rebased: the same step reads as slower
    epoch(again, clock, steps=256, per_step=0.0008)
    again.propose(0, {})
    again.n = 64
    epoch(again, clock, steps=640, per_step=0.0015)
    assert again.propose(1, {}) == {"steps_per_execution": 1}


def test_an_estimate_counts_the_move_the_run_is_expected_to_make():
    """`expected_step`: a 0.6 ms step on TensorFlow (its host path is the
    0.5 ms prior) is expected at 0.6 - 0.5 * (1 - 1/64) ms at up to 64 a
    call; a step whose host path would be under 5% of it, or a bound under
    2, stays as timed."""
    assert steps_in_run.expected_step(6e-4, "tensorflow", 64) == pytest.approx(
        6e-4 - 5e-4 * (1 - 1 / 64)
    )
    # At most PRIOR_SHARE of a short step.
    assert steps_in_run.expected_step(2e-4, "jax", 16) == pytest.approx(
        2e-4 - 0.9 * 2e-4 * (1 - 1 / 16)
    )
    assert steps_in_run.expected_step(0.1, "tensorflow", 64) == 0.1  # 0.5%
    assert steps_in_run.expected_step(6e-4, "tensorflow", 1) == 6e-4


def test_the_trials_run_length_counts_the_steps_the_run_will_choose():
    """Issue 81: trials said "2% of a run of about 310s" of a run of 32s,
    whose steps per call the run then raised. Where the run chooses them
    (the plan's "steps.default"), `Bench.run_seconds` counts the expected
    move to a quarter of an epoch; where they are yours, the timed speed."""
    import types

    from kerascale.measure import trial_bench
    from kerascale.plan.reasons import Reason

    def bench(why):
        plan = types.SimpleNamespace(
            reasons={"steps_per_execution": why},
            global_batch_size=32,
            backend="tensorflow",
        )
        return types.SimpleNamespace(
            unbudgeted=False,
            samples=320_000,  # 100 epochs of 100 steps
            speed=32 / 6e-4,  # 0.6 ms a step at one a call
            plan=plan,
            data=types.SimpleNamespace(num_samples=3200),
        )

    run_seconds = trial_bench.Bench.run_seconds.fget
    timed = 10_000 * 6e-4
    expected = 10_000 * steps_in_run.expected_step(6e-4, "tensorflow", 25)
    chosen = run_seconds(bench(Reason("steps.default", why="not measured")))
    assert chosen == pytest.approx(expected) and chosen < timed / 4
    assert run_seconds(bench(Reason("steps.asked", n=1))) == pytest.approx(timed)
