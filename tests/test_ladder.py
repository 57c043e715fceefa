"""The decision's one ladder, on TensorFlow (issue 57): `decide` is entered
once per attempt, only from the door's loop (`plan.fallback.attempted`), and
each measurement stage runs at most once in an entry. A failure kerascale
answers (a probe that fails under the precision it chose, a first step that
fails, a model it cannot re-create) is a rung of that loop, not a retry inside
a stage or a call back up from the apply floor (tests_common/attempts.py)."""

import attempts as attempts_lib
import keras
import numpy as np
import pytest
import realworld

import kerascale
from kerascale.apply import model as model_lib
from kerascale.plan import fallback
from kerascale.plan.options import Options


def _noisy():
    keras.utils.set_random_seed(0)
    return realworld.make_noisy()


def test_a_plain_fit_decides_once(monkeypatch):
    model, x, y, _ = _noisy()
    attempts = attempts_lib.record(monkeypatch)
    kerascale.fit(model, x, y, epochs=1, verbose=0)
    attempts.check(1)


def test_a_probe_that_fails_under_bf16_is_a_rung_and_decides_again(
    monkeypatch, no_budget, bf16_cpu
):
    model, x, y, _ = _noisy()
    attempts = attempts_lib.record(monkeypatch)
    # memory_limit: a CPU's "auto" batch (Keras's 32) is checked by a probe.
    with pytest.warns(kerascale.KerascaleWarning, match="failed in the batch search"):
        history = kerascale.fit(model, x, y, epochs=1, verbose=0, memory_limit="4GiB")
    why = history.plan.reasons["precision"]
    assert why.startswith("float32: mixed_bfloat16 failed in the batch search"), why
    assert history.plan.reasons["global_batch_size"].code == "batch.searched"
    attempts.check(2)


def test_a_first_step_that_fails_is_a_rung_and_decides_again(monkeypatch, bf16_cpu):
    model, x, y, _ = _noisy()
    attempts = attempts_lib.record(monkeypatch)
    with pytest.warns(kerascale.KerascaleWarning, match="failed at the first"):
        history = kerascale.fit(model, realworld.Batches(x, y, 16), verbose=0)
    assert history.plan.precision == "float32"
    assert int(model.optimizer.iterations) == 16
    attempts.check(2)


def test_a_model_that_cannot_be_recreated_when_applied_decides_again(monkeypatch):
    """The seam: a plan that re-creates the model, whose re-creation fails
    when the run applies it. The apply floor raises; the ladder decides again
    without re-creating, and the run trains the user's own model."""
    model, x, y, _ = _noisy()
    real_recreate = model_lib.recreate
    failed = []

    def recreate(model, policy, strategy):
        if not failed:
            failed.append(True)
            raise model_lib.CannotRecreate("the seam's constructor")
        return real_recreate(model, policy, strategy)

    monkeypatch.setattr(model_lib, "recreate", recreate)
    from kerascale.plan import planner as planner_lib

    real_planner = planner_lib.Planner.__call__

    def rebuilding(self, options, **kwargs):
        import dataclasses

        plan = real_planner(self, options, **kwargs)
        return dataclasses.replace(plan, rebuild=self.model.rebuildable)

    monkeypatch.setattr(planner_lib.Planner, "__call__", rebuilding)
    attempts = attempts_lib.record(monkeypatch)
    history = kerascale.fit(
        model, x, y, batch_size=32, precision="float32", epochs=1, verbose=0
    )
    assert failed and not history.plan.rebuild
    assert np.isfinite(history.history["loss"]).all()
    attempts.check(2)


def test_each_rung_is_taken_once_and_an_unanswered_failure_is_raised():
    first = fallback.Attempt(Options.validate())
    failure = model_lib.CannotRecreate("no constructor")
    second = fallback.next_attempt(first, failure)
    assert second is not None and second.not_rebuildable == "no constructor"
    assert second.taken == ("recreate",)
    assert fallback.next_attempt(second, failure) is None
    # Variables that cannot be laid out cost the distribution, not the
    # re-creation: a rung of its own.
    placed = fallback.next_attempt(second, model_lib.CannotPlace("no layout"))
    assert placed.unplaceable == "no layout" and placed.not_rebuildable
    assert placed.taken == ("recreate", "place")
