"""Trials: the CPU decisions a rule can get wrong, measured before committing."""

import dataclasses
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CPU, CPU_BF16, dense_model, gpu_box, toy_data

import kerascale
from kerascale.errors import KerascaleWarning
from kerascale.measure import trial_bench, trials
from kerascale.measure.request import Given
from kerascale.plan import precision as precision_rules
from kerascale.plan.options import Options
from kerascale.sense import hardware
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

BF16_HOST = Hardware(cpu=CPU_BF16)


def mapped(n=256):
    x, y = toy_data(n)
    return tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b))


class FakePlan:
    precision = "mixed_bfloat16"
    micro_batch_size = 32
    step_batch_size = 32
    replicas = 1
    strategy = "default"
    backend = "tensorflow"
    global_batch_size = 32
    reasons: dict = {}  # steps per call not the run's to choose: timed speed


def test_trials_run_only_on_a_cpu_for_choices_left_open():
    model = ModelFacts(policy="float32")
    auto = Options.validate()
    assert trials.possible(auto, BF16_HOST, model)
    assert not trials.possible(auto, gpu_box(1), model)
    # A model that cannot be copied is borrowed (trained, then put back)...
    uncopyable = ModelFacts(rebuildable=False, why_not_rebuildable="x")
    assert trials.possible(auto, BF16_HOST, uncopyable)
    # ...unless what training changes is not all in its variables.
    frozen = ModelFacts(
        rebuildable=False,
        why_not_rebuildable="x",
        borrowable=False,
        why_not_borrowable="it trains with its own train_step (GAN)",
    )
    assert not trials.possible(auto, BF16_HOST, frozen)

    ds, data = mapped(), DataFacts(kind="dataset")
    bf16 = FakePlan.precision
    assert trials.wanted(auto, FakePlan, data, ds, BF16_HOST) == (True, bf16, None)
    pinned = Options.validate(precision="mixed_bfloat16", optimize_data=True)
    assert trials.wanted(pinned, FakePlan, data, ds, BF16_HOST) == (False, "", None)
    plain = tf.data.Dataset.from_tensor_slices(toy_data(8))  # no map to parallelise
    assert trials.wanted(auto, FakePlan, data, plain, BF16_HOST) == (False, bf16, None)


class Machine:
    """The measuring seam: each candidate's speed (batch, precision,
    pipeline -> samples/s) and a noise factor per timed window, in the order
    the windows run; records what was prepared and timed."""

    def __init__(self, speed, noise=(1.0,)):
        self.speed, self.noise = speed, list(noise)
        self.prepared, self.timed = [], []

    def install(self, monkeypatch):
        machine = self

        class Prepared:
            def __init__(self, session, given, data, plan, *, batch, policy, optimize):
                self.key = (batch, policy, optimize)
                machine.prepared.append(self.key)
                self.warm_speed = machine.speed(*self.key)

            def time(self, window):
                machine.timed.append(self.key)
                factor = machine.noise[(len(machine.timed) - 1) % len(machine.noise)]
                return machine.speed(*self.key) * factor

        monkeypatch.setattr(trial_bench, "Prepared", Prepared)
        return self


def coordinate_speed(batch, policy, pipe):
    base = {32: 100, 64: 180, 128: 200, 256: 203}[batch]
    return base * (1.5 if policy != "float32" else 1.0) * (0.9 if pipe else 1.0)


def run_all(**kwargs):
    """Every stage: the pipeline, the precision."""
    kwargs.setdefault("unbudgeted", True)
    kwargs.setdefault("try_pipeline", True)
    kwargs.setdefault("try_precision", "mixed_bfloat16")
    return trials.run(
        Given(dense_model(), mapped()),
        DataFacts(kind="dataset"),
        FakePlan,
        BF16_HOST,
        verbose=0,
        **kwargs,
    )


def test_stages_time_their_candidates_in_interleaved_rounds(monkeypatch):
    m = Machine(coordinate_speed).install(monkeypatch)
    r = run_all()
    # Pipeline at the plan's batch: as given (plain) against optimised,
    # interleaved A B A B A B; as given is faster here. Precision: float32
    # (plain) against bf16, which is 1.5x faster, beyond any spread.
    pipeline = [(32, "mixed_bfloat16", False), (32, "mixed_bfloat16", True)]
    assert m.timed[:6] == pipeline * 3
    assert m.timed[6:] == [(32, "float32", False), (32, "mixed_bfloat16", False)] * 3
    assert (r.batch, r.optimize_data, r.precision) == (32, False, "mixed_bfloat16")
    assert r.uncertain == ()
    # Each candidate prepared (copied, traced) once for all its rounds.
    assert len(m.prepared) == len(set(m.prepared)) == 3
    why = r.why("precision")
    assert "3 interleaved rounds" in why
    assert "32, float32, pipeline as given: 100 ± 0% samples/s" in why
    assert "32, mixed_bfloat16, pipeline as given: 150 ± 0% samples/s" in why
    # Cached, and confident: nothing is measured again.
    m.timed.clear()
    again = run_all()
    assert m.timed == [] and again.cached
    assert (again.optimize_data, again.precision) == (False, "mixed_bfloat16")


def test_a_difference_within_the_spread_keeps_the_plain_choice(monkeypatch):
    """bf16 is 5% faster, but the machine's noise moves the per-round gain
    from -8% to +12%: a tie, so float32 (what model.fit does) stays; the
    decision is cached as uncertain and measured again on the next runs, up
    to MAX_ATTEMPTS runs."""

    def speed(batch, policy, pipe):
        return 105.0 if policy == "mixed_bfloat16" else 100.0

    # Windows alternate float32, bf16, one noise factor each.
    m = Machine(speed, noise=(1.0, 1.0, 1.0, 0.88, 0.94, 1.0)).install(monkeypatch)
    run_all = functools.partial(globals()["run_all"], try_pipeline=False)
    first = run_all()
    assert first.precision == "float32"
    assert first.uncertain == ("precision",)
    assert "within noise: measured again on a later run (1 of 3)" in first.why(
        "precision"
    )
    m.timed.clear()
    second = run_all()
    assert m.timed, "an uncertain decision is measured again"
    assert second.attempts == 2 and not second.cached
    run_all()
    m.timed.clear()
    fourth = run_all()
    assert m.timed == [] and fourth.cached and fourth.attempts == 3
    assert "within noise in 3 runs: a tie" in fourth.why("precision")


def test_a_clear_gain_on_a_quiet_machine_is_taken(monkeypatch):
    def speed(batch, policy, pipe):
        return 110.0 if policy == "mixed_bfloat16" else 100.0

    Machine(speed, noise=(1.0, 1.0, 1.01, 1.01, 0.99, 0.99)).install(monkeypatch)
    r = run_all(try_pipeline=False)
    assert r.precision == "mixed_bfloat16" and r.uncertain == ()


def test_a_busy_moment_hits_every_candidate_alike(monkeypatch):
    """bf16 is 40% faster; a busy spell halves whatever runs in the second
    round. Interleaved, both lose that round alike: bf16 still wins every
    round, and is taken, with no doubt."""

    def speed(batch, policy, pipe):
        return 140.0 if policy == "mixed_bfloat16" else 100.0

    m = Machine(speed, noise=(1.0, 1.0, 0.5, 0.5, 1.0, 1.0)).install(monkeypatch)
    r = run_all(try_pipeline=False)
    assert [k[1] for k in m.timed] == ["float32", "mixed_bfloat16"] * 3
    assert r.precision == "mixed_bfloat16" and r.uncertain == ()


def test_the_budget_skips_what_the_run_cannot_pay_for(monkeypatch):
    """10 epochs of 256 samples at a first estimate of 1000 samples/s (batch
    32) is a 2.6 s run: no stage costs less than a tenth of that; the plan
    says so."""
    first = {"first_speed": lambda: 1000.0, "unbudgeted": False}
    m = Machine(coordinate_speed).install(monkeypatch)
    r = run_all(run_samples=2560, **first)
    assert m.prepared == [] and r.trials == ()
    # 80 steps: fewer than a thirtieth of the steps the timing trains, so
    # refused without a speed (nothing run, nothing estimated).
    assert dict(r.skipped)["data_changes"] == (
        "the pipeline trials would train at least 36 steps; they may save 3% of "
        "a run of about 80 steps"
    )
    # 1,250 steps at that speed (40 s): refused on the seconds.
    m = Machine(coordinate_speed).install(monkeypatch)
    r = run_all(run_samples=40_000, **first)
    assert m.prepared == [] and r.trials == ()
    skipped = dict(r.skipped)["precision"]
    assert skipped.startswith("the precision trials would take about")
    assert skipped.endswith("of a run of about 40s")
    assert not r.measured("precision") and not r.measured("data_changes")
    # A long run (two hours at that speed) affords every stage.
    m = Machine(coordinate_speed).install(monkeypatch)
    r = run_all(run_samples=1000 * 7200, **first)
    assert r.skipped == () and r.measured("precision") and r.measured("data_changes")
    # Unknown length: nothing is measured.
    r = run_all(unbudgeted=False, run_samples=None, fresh=True)
    assert "the run's length is unknown" in dict(r.skipped)["precision"]


def test_stages_run_in_the_order_of_their_expected_value(monkeypatch):
    """A 100,000-sample run at a first estimate of 2000 samples/s (50 s): the
    precision trial (10% of the run expected) is worth its cost; the
    pipeline trial (3%) is not. The precision stage runs first and alone;
    the other is skipped with its reason. Each stage's cost: 1.5 s a
    candidate prepared, 0.6 s a candidate timed."""
    monkeypatch.setattr(
        trial_bench.Bench, "_cost", lambda self, new, timed: 1.5 * new + 0.6 * timed
    )

    def speed(batch, policy, pipe):
        return 2000.0 * (1.1 if policy != "float32" else 1.0)

    first = {"first_speed": lambda: 2000.0, "unbudgeted": False}
    m = Machine(speed).install(monkeypatch)
    r = run_all(run_samples=100_000, **first)
    assert m.timed[:2] == [(32, "float32", True), (32, "mixed_bfloat16", True)]
    assert r.measured("precision") and r.precision == "mixed_bfloat16"
    skipped = dict(r.skipped)["data_changes"]
    assert skipped.startswith("the pipeline trials would take")
    assert not r.measured("data_changes")
    # A long run repays both: the precision first (the larger gain), then
    # the pipeline.
    m = Machine(speed).install(monkeypatch)
    run_all(run_samples=10**8, fresh=True, **first)
    assert [k[1] for k in m.timed[:2]] == ["float32", "mixed_bfloat16"]
    assert [k[2] for k in m.timed[-2:]] == [False, True]  # the pipeline last
    # Unbudgeted, the coordinates' order: the pipeline, then the precision.
    m = Machine(speed).install(monkeypatch)
    run_all(fresh=True)
    assert [k[2] for k in m.timed[:2]] == [False, True]


def test_without_a_first_estimate_the_first_candidate_gives_one(monkeypatch):
    """No search ran (a batched dataset): the first candidate's warm-up
    measures the speed; the run (300 s at 100 samples/s) affords the
    precision stage (about 12 s of 0.32 s steps: 3 rounds of 2 candidates,
    each 4 steps and 2 to warm up a new iterator)."""
    m = Machine(lambda b, p, o: 100.0).install(monkeypatch)
    r = run_all(try_pipeline=False, unbudgeted=False, run_samples=30_000)
    assert m.prepared[0] == (32, "float32", True)  # prepared first, then weighed
    assert r.measured("precision")
    # 360 steps (115 s, a tenth of which is less than the stage's 12 s):
    # the candidate prepared for a speed, then refused.
    m = Machine(lambda b, p, o: 100.0).install(monkeypatch)
    r = run_all(try_pipeline=False, unbudgeted=False, run_samples=11_520, fresh=True)
    assert m.prepared == [(32, "float32", True)] and not r.measured("precision")
    assert "the precision trials would take" in dict(r.skipped)["precision"]
    # 16 steps: refused in steps, before anything is prepared.
    m.prepared.clear()
    r = run_all(try_pipeline=False, unbudgeted=False, run_samples=500, fresh=True)
    assert (
        m.prepared == []
        and "would train at least 36 steps" in dict(r.skipped)["precision"]
    )
    # The speed it measured is kept: the next run is weighed without
    # preparing anything (which would draw on the dataset's shuffle state).
    m.prepared.clear()
    again = run_all(try_pipeline=False, unbudgeted=False, run_samples=600)
    assert m.prepared == [] and not again.measured("precision")


@pytest.mark.serial
def test_real_trials_time_copies_and_leave_the_model_alone():
    model = dense_model()
    before = [w.copy() for w in model.get_weights()]
    x, y = toy_data(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b))
    plan = kerascale.plan(
        model, ds, batch_size=32, precision="mixed_bfloat16", verbose=0
    )
    r = trials.run(
        Given(model, ds),
        DataFacts(kind="dataset"),
        plan,
        BF16_HOST,
        try_pipeline=True,
        try_precision="mixed_bfloat16",
        unbudgeted=True,
        verbose=0,
    )
    assert len(r.trials) == 4 and r.seconds > 0
    assert all(len(t.repeats) == 3 and t.samples_per_s > 0 for t in r.trials)
    after = model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert keras.config.dtype_policy().name == "float32"
    assert not model.optimizer.built or int(model.optimizer.iterations) == 0


@pytest.mark.serial
def test_fit_on_a_bf16_cpu_measures_and_says_so(monkeypatch, capsys, no_budget):
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    model = dense_model()
    history = kerascale.fit(model, mapped(), batch_size=32, epochs=1, verbose=0)
    plan = history.plan
    assert plan.reasons["precision"].code == "trials.measured"
    assert plan.reasons["precision"].details["cached"] is False
    assert plan.reasons["data_changes"].code == "trials.measured"
    assert plan.precision in ("float32", "mixed_bfloat16")
    assert capsys.readouterr().out == ""  # verbose=0: the trials print nothing
    # A second plan reads the cache.
    again = kerascale.plan(model, mapped(), batch_size=32, verbose=0)
    timed = [w for w in plan.reasons.values() if w.code == "trials.measured"]
    if any(w.details["uncertain"] for w in timed):
        # Decided within noise: this second run measured again.
        assert again.reasons["precision"].details["cached"] is False
    else:
        assert again.reasons["precision"].details["cached"] is True
        assert again.precision == plan.precision


def test_no_trials_for_pinned_choices_or_accelerators(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("no trial expected")

    monkeypatch.setattr(trial_bench, "Prepared", boom)
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    p = kerascale.plan(
        dense_model(),
        mapped(),
        batch_size=32,
        precision="mixed_bfloat16",
        optimize_data=True,
        verbose=0,
    )
    assert p.precision == "mixed_bfloat16"
    monkeypatch.setattr(
        hardware, "detect_hardware", lambda nvml=True: Hardware(cpu=CPU)
    )
    p = kerascale.plan(dense_model(), mapped(), batch_size=32, optimize_data=False)
    assert p.precision == "float32"  # no bf16 here: the rule's float32, untried


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_optimize_data_is_validated(bad):
    with pytest.raises(kerascale.ConfigurationError, match="optimize_data="):
        kerascale.plan(dense_model(), mapped(), optimize_data=bad, verbose=0)


def test_a_short_fit_skips_the_trials_and_keeps_float32(monkeypatch):
    """A real fit of one second on a bf16 CPU: the trials would cost more
    than they may save of it, so the rule's float32 stands (as model.fit
    trains) and the plan says why."""
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    history = kerascale.fit(dense_model(), mapped(), batch_size=32, epochs=1, verbose=0)
    plan = history.plan
    assert plan.precision == "float32"  # the rule for a bf16 CPU: the trials'
    why = plan.reasons["precision"]
    assert why.code == "precision.cpu_by_trial"
    assert "bf16 runs faster for some models only" in why
    note = why.details["note"]  # the figures move with the machine's load
    # Eight steps: refused in steps, before any speed is estimated.
    assert note.startswith("trials skipped: the precision trials would train at least")
    assert "of a run of about 8" in note


def test_a_bf16_cpu_keeps_float32_unless_the_trials_time_bf16_faster(monkeypatch):
    """On a CPU with bf16 math the rule keeps float32 on both backends: bf16
    was as often slower as faster there (benchmarks/README.md). The trials
    time it on your model where the run is long enough, and take it only
    where it is faster (faked here at their seam, `Bench.compare`)."""
    from kerascale.measure import budget
    from kerascale.measure.trial_bench import Trial

    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    assert precision_rules.trial_candidate(BF16_HOST) == "mixed_bfloat16"
    monkeypatch.setattr(budget, "REPAY", 0.0)  # the trials pay, however short
    speeds = {"float32": 1000.0, "mixed_bfloat16": 2000.0}

    def compare(self, keys, field):
        out = [  # three rounds, alike
            Trial(b, p, d, speeds[p], 0.0, (speeds[p],) * 3, stage=field)
            for b, p, d in keys
        ]
        self.trials += out
        return out

    monkeypatch.setattr(trial_bench.Bench, "compare", compare)
    x, y = toy_data(256)
    faster = kerascale.plan(dense_model(), x, y, epochs=5, verbose=0)
    assert faster.precision == "mixed_bfloat16"
    speeds["mixed_bfloat16"] = 600.0
    slower = kerascale.plan(dense_model(), x, y, epochs=5, remeasure=True, verbose=0)
    assert slower.precision == "float32"


def test_an_input_that_cannot_be_read_before_the_run_stays_float32(monkeypatch):
    """Labels as a Python list (keras-hub's task tests pass them so) cannot
    be read before the run, so no trial times bf16: the run trains in
    float32, as model.fit does. (A one-step keras-hub MobileNet fit took
    19 s in bf16 against plain fit's 7 s in float32.)"""
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    x, y = toy_data(64)
    with pytest.warns(KerascaleWarning, match="Python lists"):
        plan = kerascale.plan(dense_model(), x, list(y), epochs=1, verbose=0)
    assert plan.precision == "float32"
    assert plan.reasons["precision"].code == "precision.cpu_by_trial"
    asked = kerascale.plan(
        dense_model(), x, list(y), epochs=1, precision="mixed_bfloat16", verbose=0
    )
    assert asked.precision == "mixed_bfloat16"


def test_a_run_of_unknown_length_stays_float32_and_says_so(monkeypatch):
    """No trial times bf16 on a run of unknown length: float32, as model.fit
    trains (Keras's steps_per_execution test compares a run with
    steps_per_epoch against one without, on a dataset of unknown size, to
    1e-6)."""
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: BF16_HOST)
    x, y = toy_data(64)
    ds = tf.data.Dataset.from_generator(
        lambda: iter(zip(x, y, strict=True)),
        output_signature=(
            tf.TensorSpec((4,), tf.float32),
            tf.TensorSpec((), tf.int64),
        ),
    ).batch(8)
    plan = kerascale.plan(dense_model(), ds, epochs=1, verbose=0)
    assert plan.precision == "float32"
    assert plan.reasons["precision"].code == "precision.cpu_by_trial"


def test_float32_is_not_timed_where_its_activations_would_pass_the_limit():
    """The trials train in the process where fit trains: float32 is timed
    against bf16 at bf16's searched batch only where the search's memory
    model, with activations twice as wide, keeps it under the limit (issue
    55: a CNN's float32 trial took that process over a 1 GiB limit)."""
    import types

    from kerascale.measure.result import BatchSearchResult, MemoryModel
    from kerascale.measure.trials import float32_over

    found = BatchSearchResult(
        batch_size=2000,
        per_replica_batch_size=2000,
        replicas=1,
        precision="mixed_bfloat16",
        strategy="default",
        largest_fitting=2060,
        smallest_failing=2080,
        mode="max",
        probes=(),
        memory_model=MemoryModel(800 << 20, 100 << 10),
        limit_bytes=1 << 30,
        granularity=8,
        margin=0.03,
        reasons={},
    )

    def plan(batch, precision="mixed_bfloat16"):
        return types.SimpleNamespace(micro_batch_size=batch, precision=precision)

    over = float32_over(found, plan(2000))
    assert over.code == "trials.float32_over"
    assert over.details["need"] == (800 << 20) + 2 * (100 << 10) * 2000
    assert float32_over(found, plan(1000)) is None  # 995 MiB: under
    assert float32_over(found, plan(2000, "float32")) is None
    unbound = dataclasses.replace(found, limit_bytes=None)
    assert float32_over(unbound, plan(2000)) is None
    # XLA's count fits no line: half the batch that ran out is the bound.
    counted = dataclasses.replace(found, memory_model=None)
    assert float32_over(counted, plan(1100)).details["need"] is None
    assert float32_over(counted, plan(1000)) is None


def test_the_trials_cost_names_the_speed_its_run_estimate_is_at():
    """Issue 81: "7s, 2% of a run of about 310s" was said of a run of 32s;
    the estimate is at the speed the trials timed, and says so."""
    TrialResult = trials.TrialResult
    r = TrialResult(32, "float32", False, (), seconds=7.0, run_seconds=303.0)
    said = "trials took 7s, 2% of a run of about 310s at the speed they timed"
    assert r.cost() == said
    assert TrialResult(32, "float32", False, (), seconds=7.0).cost() == "trials took 7s"
