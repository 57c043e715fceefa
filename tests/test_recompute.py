"""Recomputation weighed against accumulation (`kerascale.measure.recompute`):
the rule, through the search seam (each search's answer and speeds given),
and on TensorFlow, `recompute=True` through `fit` for real. The real
weighing runs in tests_jax/test_remat.py (XLA's count) and, under a real
memory limit, in benchmarks/remat.py."""

import numpy as np
import pytest
from conftest import CPU, gpu_box
from test_remat import gelu_mlp

import kerascale
from kerascale import _keras_compat as keras_compat
from kerascale.apply import remat
from kerascale.measure import advice, recompute
from kerascale.measure.decide import Decided
from kerascale.measure.request import SearchOptions
from kerascale.measure.result import BatchSearchResult, ProbeResult
from kerascale.plan.measured import Measured
from kerascale.plan.options import Options, pin, pinned_reasons
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

HW = gpu_box(1)
MODEL, DATA = ModelFacts(policy="float32"), DataFacts("arrays", num_samples=100_000)


def result(per_replica, *, speed=None, failing=True):
    probes = (ProbeResult(per_replica, "ok", samples_per_s=speed),)
    return BatchSearchResult(
        batch_size=per_replica,
        per_replica_batch_size=per_replica,
        replicas=1,
        precision="float32",
        strategy="default",
        largest_fitting=per_replica,
        smallest_failing=per_replica + 1 if failing else None,
        mode="max",
        probes=probes,
        memory_model=None,
        limit_bytes=None,
        granularity=1,
        margin=0.0,
        reasons={"batch_size": "the largest that fits"},
    )


def decided_at(batch_size, bound, hw=HW):
    options = Options.validate(batch_size=batch_size)
    found = result(bound)
    plan = make_plan(hw, options, MODEL, DATA, search=found)
    return Decided(hw, MODEL, DATA, plan, None, options, found)


class Searcher:
    """The engine's search at the seam: the bound with and without
    recomputation, and each micro-batch's speed, as given."""

    def __init__(self, bound_with, speeds):
        self.bound_with, self.speeds, self.calls = bound_with, speeds, []

    def __call__(
        self, plan, options, *, first=None, accumulation_steps=None, timed=False
    ):
        self.calls.append((plan.recompute, plan.micro_batch_size, timed))
        if not timed:
            return result(self.bound_with)
        micro = plan.micro_batch_size
        return result(micro, speed=self.speeds.get((plan.recompute, micro)))


def test_recomputation_is_chosen_where_its_larger_micro_batch_trains_faster():
    decided = decided_at(512, 191)
    assert decided.plan.micro_batch_size == 128
    search = Searcher(512, {("", 128): 1000.0, ("activations", 512): 1200.0})
    weighing = recompute.weighed(decided, search, SearchOptions(), 512)
    plan = weighing.plan
    assert (plan.recompute, plan.micro_batch_size, plan.accumulation_steps) == (
        "activations",
        512,
        1,
    )
    assert plan.global_batch_size == 512  # the batch asked for, kept
    assert (weighing.bound, weighing.bound_without) == (512, 191)
    assert "recomputation: 512 x 1 x 1 at 1,200 samples/s" in weighing.why
    assert "accumulation alone: 128 x 1 x 4 at 1,000 samples/s" in weighing.why
    assert [c[2] for c in search.calls] == [False, True, True]


@pytest.mark.parametrize(
    "bound_with, speeds, why",
    [
        # Within GAIN: the simpler plan (no recompute) stays.
        (512, {("", 128): 1000.0, ("activations", 512): 1040.0}, "not 5% faster"),
        (512, {("", 128): 1000.0, ("activations", 512): 700.0}, "not 5% faster"),
        (512, {("", 128): 1000.0}, "not both timed"),
        # 160 fit with it, but 512 splits into micro-batches of 128 either way.
        (160, {}, "no larger micro-batch"),
    ],
)
def test_accumulation_alone_stays_unless_recomputation_wins(bound_with, speeds, why):
    decided = decided_at(512, 191)
    weighing = recompute.weighed(
        decided, Searcher(bound_with, speeds), SearchOptions(), 512
    )
    assert weighing.plan == decided.plan
    assert weighing.why.startswith("not used") and why in weighing.why


def test_only_a_batch_that_memory_binds_is_weighed():
    split = decided_at(512, 191)
    assert recompute.binding(split, 512)
    assert not recompute.binding(decided_at(128, 191), 128)  # it fits
    auto = decided_at("auto", 191)
    assert recompute.binding(auto, None)  # memory stopped the search
    capped = Decided(
        HW, MODEL, DATA, auto.plan, None, auto.options, result(191, failing=False)
    )
    assert not recompute.binding(capped, None)  # the cap did


def test_diagnose_names_what_recomputation_buys():
    decided = decided_at(512, 191)
    search = Searcher(512, {("", 128): 1000.0, ("activations", 512): 1500.0})
    weighing = recompute.weighed(decided, search, SearchOptions(), 512)
    first = advice.memory_advice(weighing.plan, weighing)[0]
    assert first.expected_gain == pytest.approx(1.5)
    assert "512 per replica fit in one pass with it, 191 without (2.68x" in first.why


def test_recompute_true_trains_as_plain_fit_and_is_taken_off_after():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 16)).astype("float32"), rng.integers(0, 3, 128)
    model = gelu_mlp()
    history = kerascale.fit(
        model,
        x,
        y,
        batch_size=16,
        epochs=2,
        shuffle=False,
        verbose=0,
        precision="float32",
        optimize_data=False,
        recompute=True,
    )
    plan = history.plan
    assert plan.recompute == "activations"
    assert plan.reasons["recompute"].code == "recompute.asked"
    assert "recompute" in plan.describe()
    assert all(keras_compat.remat_mode(layer) is None for layer in model.layers)
    reference = gelu_mlp()
    expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        history.history["loss"], expected.history["loss"], rtol=1e-6
    )
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_recompute_false_is_said_in_the_plan():
    plan = make_plan(Hardware(cpu=CPU), Options.validate(recompute=False), MODEL, DATA)
    assert (plan.recompute, plan.reasons["recompute"].code) == ("", "recompute.off")


def test_the_plan_round_trips_and_a_resumed_run_keeps_its_recomputation():
    plan = make_plan(HW, Options.validate(recompute=True), MODEL, DATA)
    assert type(plan).from_json(plan.to_json()) == plan
    assert remat.MODES == (recompute.MODE,)
    pinned, names = pin(Options.validate(), plan, data_batched=False)
    assert pinned.recompute == "activations" and "recompute" in names
    said = make_plan(
        HW, pinned, MODEL, DATA, measured=Measured().decided(**pinned_reasons(names))
    )
    assert said.reasons["recompute"].code == "resumed"
    without = make_plan(HW, Options.validate(), MODEL, DATA)
    assert pin(Options.validate(), without, data_batched=False)[0].recompute == "off"


def test_find_batch_size_keeps_its_bound_when_the_search_with_recomputation_fails(
    monkeypatch,
):
    """The bound with recomputation is an optional figure beside the answer:
    where its search fails, `find_batch_size` returns the bound it found,
    with the failure in its reasons and one warning (issue 55: it raised)."""
    from kerascale.errors import BatchSizeSearchError
    from kerascale.measure import engines
    from kerascale.sense import hardware as hardware_lib

    found = result(640)
    monkeypatch.setattr(hardware_lib, "detect_hardware", lambda: HW)

    def searched(request):
        if not request.plan.recompute:  # the search without it: the bound
            return found
        assert request.host_share == found.host_share  # counted as the first
        raise BatchSizeSearchError("Even a batch of 1 runs out of memory")

    monkeypatch.setattr(engines, "batch_search", searched)
    model = gelu_mlp()
    x = np.random.default_rng(0).normal(size=(2000, 16)).astype("float32")
    y = np.zeros(2000, "int32")
    with pytest.warns(kerascale.KerascaleWarning, match="recomputation") as said:
        answer = kerascale.find_batch_size(model, x, y, verbose=0, cache=False)
    assert len(said) == 1
    assert answer.batch_size == 640 and answer.recompute_batch_size is None
    why = answer.reasons["recompute"]
    assert why.code == "recompute.weigh_failed"
    assert "Even a batch of 1" in why.details["error"]
