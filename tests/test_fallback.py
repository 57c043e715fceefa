"""The one fallback ladder (`plan.fallback.after_first_step`): after the
first training step failed, what the next attempt drops, and why."""

import dataclasses

from conftest import gpu_box

from kerascale.plan import fallback
from kerascale.plan.options import Options
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.model_facts import ModelFacts

MODEL, DATA = ModelFacts(policy="float32"), DataFacts("arrays", num_samples=10_000)


def _after(options, plan, *, searched, oom):
    error = RuntimeError("boom")
    return fallback.after_first_step(
        options, plan, "float32", searched=searched, out_of_memory=oom, error=error
    )


def test_a_searched_batch_that_ran_out_of_memory_steps_down():
    options = Options.validate()
    plan = dataclasses.replace(
        make_plan(gpu_box(1), options, MODEL, DATA),
        micro_batch_size=100,
        global_batch_size=100,
    )
    step = _after(options, plan, searched=True, oom=True)
    assert step.options.max_batch_size == 90  # STEP_DOWN of 100, one replica
    assert step.options.precision == options.precision  # nothing else dropped
    (why,) = step.measured.warnings
    assert "stepped down to at most 90" in why and "RuntimeError: boom" in why


def test_a_failure_drops_the_choices_kerascale_made_on_its_own():
    options = Options.validate()
    plan = make_plan(gpu_box(2), options, MODEL, DATA)
    assert plan.precision != "float32" and plan.replicas == 2  # kerascale's
    step = _after(options, plan, searched=False, oom=False)
    assert step.options.precision == "float32"
    assert step.options.strategy == "default"
    why = step.measured.reasons["precision"]
    assert step.measured.reasons["strategy"] == why
    assert "strategy='default' and precision='float32'" in why
    assert step.measured.warnings == (why,)


def test_nothing_to_drop_is_the_models_own_error():
    options = Options.validate(precision="float32", strategy="default")
    plan = make_plan(gpu_box(1), options, MODEL, DATA)
    assert _after(options, plan, searched=False, oom=False) is None
    bounded = Options.validate(batch_size=64, precision="float32")
    plan = make_plan(gpu_box(1), bounded, MODEL, DATA)
    assert _after(bounded, plan, searched=True, oom=True) is None


def test_steps_per_call_kerascale_chose_go_back_to_the_models_own():
    """A first step that fails at the steps per call kerascale measured
    trains next at the model's own value, as plain `fit` would; a value of
    yours (fit's or compile's) is the model's own error."""
    options = Options.validate(precision="float32", strategy="default")
    plan = dataclasses.replace(
        make_plan(gpu_box(1), options, MODEL, DATA), steps_per_execution=16
    )
    step = _after(options, plan, searched=False, oom=False)
    assert step.options.steps_per_execution == 1
    why = step.measured.reasons["steps_per_execution"]
    assert "16 steps a call" in why and "steps_per_execution=1" in why
    asked = dataclasses.replace(options, steps_per_execution=16)
    assert _after(asked, plan, searched=False, oom=False) is None
    compiled = fallback.after_first_step(
        options,
        plan,
        "float32",
        searched=False,
        out_of_memory=False,
        error=RuntimeError("boom"),
        model_steps=16,
    )
    assert compiled is None
