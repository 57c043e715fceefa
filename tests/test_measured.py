"""`Measured`: what planning found beyond the rules, as the plan states it
(`make_plan` renders it; no stage edits a plan another made)."""

from conftest import gpu_box

from kerascale.plan.measured import Measured
from kerascale.plan.options import Options
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.model_facts import ModelFacts

MODEL, DATA = ModelFacts(policy="float32"), DataFacts("arrays", num_samples=10_000)


def test_a_finding_replaces_the_rules_reason_and_a_note_is_added_to_it():
    plain = make_plan(gpu_box(1), Options.validate(), MODEL, DATA)
    found = (
        Measured()
        .decided(precision="timed: faster")
        .noted("global_batch_size", "batch search skipped: too short")
        .warned("one", "one", "")
    )
    plan = make_plan(gpu_box(1), Options.validate(), MODEL, DATA, measured=found)
    assert plan.reasons["precision"] == "timed: faster"
    batch = plain.reasons["global_batch_size"]
    assert (
        plan.reasons["global_batch_size"]
        == f"{batch} (batch search skipped: too short)"
    )
    assert plan.warnings == (*plain.warnings, "one")
    assert plan.precision == plain.precision  # the words only: options decide


def test_a_later_finding_wins_and_drops_the_fields_skip_note():
    first = Measured().noted("precision", "trials skipped: short").warned("a")
    later = first | Measured().decided(precision="the chief's").warned("b", "a")
    assert later.reasons == {"precision": "the chief's"}
    assert later.notes == {}
    assert later.warnings == ("a", "b")


def test_materialized_data_says_so_first():
    found = Measured(materialized="materialized to /tmp/x")
    plan = make_plan(gpu_box(1), Options.validate(), MODEL, DATA, measured=found)
    assert plan.data_changes.materialized
    assert plan.reasons["data_changes"].startswith("materialized to /tmp/x; ")
