"""fit's check of a batch `find_batch_size` answered in this process reads
the answer (`kerascale.measure.answered`, issue 55: on JAX the check of the
guide's answer split it into 2 micro-batches in about half the runs, its
real steps' figures varying by more than the margin). Only the same model,
data objects, precision, replicas, recomputation and limits, a batch at or
below the answer, and a process that has not grown are read; anything else
is measured again. The guide's sample follows it for real on both backends
(tests/test_batch_search.py, tests_jax/test_remat.py)."""

import dataclasses

import keras
import numpy as np
import pytest
from conftest import CPU
from test_recompute import result

from kerascale.measure import answered, batch_plan, host_share
from kerascale.measure.request import Given, SearchOptions
from kerascale.plan.data_changes import DataChanges
from kerascale.plan.options import Options
from kerascale.plan.rules import make_plan
from kerascale.sense import memory
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

HW = Hardware(cpu=CPU)
DATA = DataFacts("arrays", num_samples=4000)
LIMIT = SearchOptions.validate(memory_limit="1GiB")


def plan_at(batch, precision="float32", read_ahead=False):
    plan = make_plan(
        HW, Options.validate(batch_size=batch), ModelFacts(policy=precision), DATA
    )
    return dataclasses.replace(
        plan, precision=precision, data_changes=DataChanges(read_ahead=read_ahead)
    )


@pytest.fixture
def setting():
    answered.forget()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    x = np.zeros((4000, 8), "float32")
    y = np.zeros((4000, 2), "float32")
    answered.remember(model, x, y, plan_at(1288), LIMIT, result(1288))
    yield model, x, y
    answered.forget()


def test_the_check_of_an_answer_reads_it(setting):
    model, x, y = setting
    for batch in (1288, 640):
        found = answered.recall(model, x, y, plan_at(batch), LIMIT)
        assert found is not None and found.per_replica_batch_size == 1288
        why = found.reasons["batch_size"]
        assert why.code == "search.answered_here" and f"{batch} per replica" in why


def test_a_check_is_measured_where_anything_differs(setting, monkeypatch):
    model, x, y = setting
    assert answered.recall(model, x, y, plan_at(1296), LIMIT) is None  # larger
    assert answered.recall(model, x.copy(), y, plan_at(1288), LIMIT) is None
    bf16 = plan_at(1288, precision="mixed_bfloat16")
    assert answered.recall(model, x, y, bf16, LIMIT) is None
    other = SearchOptions.validate(memory_limit="2GiB")
    assert answered.recall(model, x, y, plan_at(1288), other) is None
    twin = keras.models.clone_model(model)
    twin.compile("adam", "mse")
    assert answered.recall(twin, x, y, plan_at(1288), LIMIT) is None  # not it
    # The same model recompiled otherwise: its fingerprint changed.
    model.compile("sgd", "mae")
    assert answered.recall(model, x, y, plan_at(1288), LIMIT) is None


def test_a_process_grown_since_is_measured_again(setting, monkeypatch):
    model, x, y = setting
    slack = host_share.slack(LIMIT.memory_limit)
    now = memory.resident_bytes()
    monkeypatch.setattr(memory, "resident_bytes", lambda: now + slack + (64 << 20))
    assert answered.recall(model, x, y, plan_at(1288), LIMIT) is None


def test_batches_read_ahead_count_within_the_slack(setting):
    model, x, y = setting
    # 3 batches of 1288 samples of 40 bytes: far within the slack.
    ahead = plan_at(1288, read_ahead=True)
    assert answered.recall(model, x, y, ahead, LIMIT) is not None
    # A dataset's batches cannot be counted: measured again.
    assert answered._held_bytes(iter([x]), None, 1288) is None
    big = np.zeros((4000, 4096), "float32")  # 3 x 1288 x 16 KiB: 60 MiB
    answered.remember(model, big, y, plan_at(1288), LIMIT, result(1288))
    assert answered.recall(model, big, y, ahead, LIMIT) is None


def test_an_answer_without_a_memory_bound_is_not_kept():
    answered.forget()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    x = np.zeros((10, 8), "float32")
    answered.remember(model, x, None, plan_at(8), SearchOptions(), result(8))
    assert answered.recall(model, x, None, plan_at(8), LIMIT) is None
    assert answered.recall(model, x, None, plan_at(8), SearchOptions()) is None


def test_fit_s_check_reads_the_answer_and_measures_nothing(setting, monkeypatch):
    """Through `batch_for_plan`'s check branch: the engine is not asked."""
    model, x, y = setting
    asked = []
    monkeypatch.setattr(batch_plan, "searched", lambda *a: asked.append(a))

    class Planner:
        hardware, data = HW, DATA
        model = ModelFacts(policy="float32")

    options = Options.validate(batch_size=1288)
    found, warning = batch_plan.batch_for_plan(
        Given(model, x, y), options, Planner(), plan_at(1288), LIMIT
    )
    assert not asked and found.reasons["batch_size"].code == "search.answered_here"
    assert warning == ""
