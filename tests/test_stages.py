"""The decision's one loop over declared stages (issue 82): each stage
skipped, refused by the one gate or measured, its findings (never a plan)
turned into the plan in one place, what it carries handed to the next; and
the recording of tests_common/attempts.py, which fails where a stage is
entered from elsewhere than the loop."""

import attempts as attempts_lib
import pytest
from conftest import CPU, dense_model, toy_data

import kerascale
from kerascale.measure import budget as budget_lib
from kerascale.measure import decide as decide_lib
from kerascale.measure import stages
from kerascale.measure.decided import Decided, Found
from kerascale.measure.request import Given
from kerascale.plan.measured import Measured
from kerascale.plan.options import Options
from kerascale.plan.reasons import Reason
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

HW = Hardware(cpu=CPU)


def at(**call) -> stages.At:
    options, model, data = Options.validate(), ModelFacts(), DataFacts("dataset")
    plan = make_plan(HW, options, model, data)
    decided = Decided(HW, model, data, plan, None, options)
    return stages.At(decided, Given(None, None), None, None, stages.Call(**call))


class Recorded:
    """A stage that records what the loop asked of it, and what it saw."""

    def __init__(self, name, log, *, skip=None, price=None, found=None):
        self.name, self.log = name, log
        self._skip, self._price, self._found = skip, price, found or Found()

    def skip(self, at):
        self.log.append((self.name, "skip", dict(at.carried)))
        return self._skip

    def price(self, at):
        self.log.append((self.name, "price"))
        return self._price

    def refused(self, at, why):
        self.log.append((self.name, "refused", why))
        return Found(Measured().noted("recompute", why))

    def measure(self, at):
        self.log.append((self.name, "measure"))
        return self._found


def test_the_loop_skips_prices_refuses_and_measures_each_stage_in_order():
    log = []
    batch = Options.validate(batch_size=64)
    dear = budget_lib.Price("recompute", cost=30.0, run_seconds=10.0, share=0.1)
    cheap = budget_lib.Price("recompute", cost=0.1, run_seconds=100.0, share=0.1)
    listed = [
        Recorded("skipped", log, skip=Found()),
        Recorded(
            "free", log, found=Found(settled={"options": batch}, carried={"k": 1})
        ),
        Recorded("dear", log, price=dear),
        Recorded("cheap", log, price=cheap, found=Found(carried={"j": 2})),
    ]
    start = at()
    done = stages.run(listed, start)
    assert log == [
        ("skipped", "skip", {}),
        ("free", "skip", {}),
        ("free", "price"),
        ("free", "measure"),
        ("dear", "skip", {"k": 1}),
        ("dear", "price"),
        ("dear", "refused", budget_lib.unpaid(30.0, 10.0, 0.1, "recompute")),
        ("cheap", "skip", {"k": 1}),
        ("cheap", "price"),
        ("cheap", "measure"),
    ]
    # The plan is made again from the findings: the batch settled, the
    # gate's refusal a note on the field's reason.
    assert start.decided.plan.global_batch_size == 32
    assert done.decided.plan.global_batch_size == 64
    assert done.decided.options is batch
    assert "the weighing would take about 30s" in done.decided.plan.reasons["recompute"]
    assert done.carried == {"k": 1, "j": 2}


def test_a_stage_that_finds_nothing_leaves_the_decision_as_it_was():
    start = at()
    done = stages.run(
        [Recorded("idle", []), Recorded("skipped", [], skip=Found())], start
    )
    assert done is start  # no plan made again for nothing found


def test_a_found_reason_replaces_the_rules():
    why = Reason("recompute.not_weighed", why="a test")
    done = stages.run(
        [Recorded("r", [], found=Found(Measured().decided(recompute=why)))], at()
    )
    assert done.decided.plan.reasons["recompute"].code == "recompute.not_weighed"


def test_the_fit_and_search_lists_hold_one_stage_of_each_kind():
    for listed in (decide_lib.FIT, decide_lib.SEARCH):
        names = [s.name for s in listed]
        assert len(names) == len(set(names)), names
        for s in listed:
            assert all(
                callable(getattr(s, m)) for m in ("skip", "price", "refused", "measure")
            )


def test_the_recording_fails_where_a_stage_enters_another(monkeypatch):
    """The check in tests_common/attempts.py can fail: a stage that enters
    another from inside itself is caught."""

    class Rogue(stages.Priceless):
        name = "rogue"

        def skip(self, at):
            return None

        def measure(self, at):
            return stages.entered(Recorded("inner", []), at)

    monkeypatch.setattr(decide_lib, "FIT", (*decide_lib.FIT, Rogue()))
    attempts = attempts_lib.record(monkeypatch)
    x, y = toy_data(64)
    kerascale.plan(dense_model(), x, y, batch_size=32, verbose=0)
    with pytest.raises(
        AssertionError, match=r"Recorded entered from test_stages\.measure"
    ):
        attempts.check(1)


def test_the_gate_refuses_timing_the_host_path_for_a_short_run():
    """Steps per call timed before the run (a `steps_per_epoch` the run
    cannot move at an epoch's end) is a priced stage: for a run of 8 steps
    the gate refuses it, and the plan keeps one a call with the gate's
    words."""
    x, y = toy_data(512)
    p = kerascale.plan(dense_model(), x, y, steps_per_epoch=8, epochs=1, verbose=0)
    assert p.steps_per_execution == 1
    why = p.reasons["steps_per_execution"]
    assert "not measured: timing the host's path would take about" in why
    assert "of a run of about" in why


def test_what_a_stage_only_carries_makes_no_plan_again():
    """A stage that leaves something for a later one and finds nothing for
    the plan keeps the decision as it was: its plan is not made again."""
    start = at()
    done = stages.run([Recorded("carrier", [], found=Found(carried={"k": 1}))], start)
    assert done.decided is start.decided and done.carried == {"k": 1}
