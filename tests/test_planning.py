import dataclasses
import re

import pytest
from conftest import CPU, CPU_BF16, gpu_box

import kerascale
from kerascale.plan.data_changes import DataChanges
from kerascale.plan.options import Options, pin
from kerascale.plan.plan import Plan
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import ClusterInfo, GPUInfo, Hardware, TPUInfo
from kerascale.sense.model_facts import ModelFacts

ARRAYS = DataFacts(kind="arrays", num_samples=100_000)
FLOAT32 = ModelFacts(policy="float32")


def plan_for(hw, model=FLOAT32, data=ARRAYS, **options):
    return make_plan(hw, Options.validate(**options), model, data)


CPU_ONLY = Hardware(cpu=CPU)
TPU_HOST = Hardware(cpu=CPU, tpu=TPUInfo("my-tpu", "TPU_NAME"))
MIXED_GPUS = Hardware(
    cpu=CPU,
    gpus=(
        GPUInfo(0, "NVIDIA A100", 40 << 30, (8, 0)),
        GPUInfo(1, "Tesla T4", 16 << 30, (7, 5)),
    ),
)


@pytest.mark.parametrize(
    "hw, strategy, replicas, devices",
    [
        (TPU_HOST, "tpu", 8, ("my-tpu",)),
        (gpu_box(4), "mirrored", 4, ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3")),
        (MIXED_GPUS, "mirrored", 2, ("/gpu:0", "/gpu:1")),
        (gpu_box(1), "default", 1, ("/gpu:0",)),
        (CPU_ONLY, "default", 1, ("/cpu:0",)),
    ],
)
def test_auto_strategy_table(hw, strategy, replicas, devices):
    p = plan_for(hw)
    assert (p.strategy, p.replicas, p.devices) == (strategy, replicas, devices)
    assert p.reasons["strategy"]


def test_mixed_gpus_warn_that_the_slowest_sets_the_pace():
    p = plan_for(MIXED_GPUS)
    assert any("slowest card sets the pace" in w for w in p.warnings)
    assert not any("slowest" in w for w in plan_for(gpu_box(2)).warnings)


@pytest.mark.parametrize(
    "requested, strategy, replicas",
    [
        ("one_device", "one_device", 1),
        ("default", "default", 1),
        ("mirrored", "mirrored", 4),
    ],
)
def test_explicit_strategy_overrides(requested, strategy, replicas):
    p = plan_for(gpu_box(4), strategy=requested)
    assert (p.strategy, p.replicas) == (strategy, replicas)
    assert p.reasons["strategy"].code == "strategy.asked"


def test_strategy_instance_overrides():
    import tensorflow as tf

    s = tf.distribute.OneDeviceStrategy("/cpu:0")
    p = plan_for(gpu_box(4), strategy=s)
    assert (p.strategy, p.replicas) == ("OneDeviceStrategy", 1)


def test_mirrored_on_logical_cpus_uses_them_all():
    hw = Hardware(cpu=dataclasses.replace(CPU, logical_devices=2))
    p = plan_for(hw, strategy="mirrored", batch_size=64)
    assert p.devices == ("/cpu:0", "/cpu:1") and p.replicas == 2
    assert p.micro_batch_size == 32


SPLIT_CPU = dataclasses.replace(CPU, logical_devices=2)


@pytest.mark.parametrize(
    "hw, strategy, replicas",
    [
        (Hardware(cpu=SPLIT_CPU), "default", 1),
        (Hardware(cpu=SPLIT_CPU, backend="jax"), "default", 1),
        (
            Hardware(
                cpu=dataclasses.replace(SPLIT_CPU, devices_stand_in=True),
                backend="jax",
            ),
            "data_parallel",
            2,
        ),
        (dataclasses.replace(gpu_box(2), backend="jax"), "data_parallel", 2),
    ],
)
def test_cpu_devices_of_one_process_are_split_only_when_asked(hw, strategy, replicas):
    # They share the process's cores: a split computes no faster, on either
    # backend. Standing in for accelerators (the tests' seam), JAX's split.
    p = plan_for(hw, batch_size=64)
    assert (p.strategy, p.replicas) == (strategy, replicas), p.reasons["strategy"]
    if hw.backend == "jax" and not (hw.gpus or hw.cpu.devices_stand_in):
        why = p.reasons["strategy"]
        assert why.code == "strategy.shared_cpu_devices" and why.details["cores"] == 8
        # (JAX's name: this process's door takes TensorFlow's)
        options = dataclasses.replace(
            Options.validate(batch_size=64), strategy="data_parallel"
        )
        asked = make_plan(hw, options, FLOAT32, ARRAYS)
        assert (asked.strategy, asked.replicas) == ("data_parallel", 2)


def test_tpu_requested_without_tpu_is_an_error():
    with pytest.raises(
        kerascale.ConfigurationError, match='strategy="tpu" needs a TPU'
    ):
        plan_for(CPU_ONLY, strategy="tpu")


@pytest.mark.parametrize(
    "hw, policy",
    [
        (TPU_HOST, "mixed_bfloat16"),
        (gpu_box(1, cc=(9, 0)), "mixed_bfloat16"),
        (gpu_box(1, cc=(8, 0)), "mixed_bfloat16"),
        (gpu_box(1, cc=(7, 5)), "mixed_float16"),
        (gpu_box(1, cc=(7, 0)), "mixed_float16"),
        (gpu_box(1, cc=(6, 1)), "float32"),
        (gpu_box(1, cc=None), "float32"),
        (MIXED_GPUS, "mixed_float16"),  # the lowest capability decides
        (Hardware(cpu=CPU_BF16), "float32"),  # bf16: the trials' candidate
        (CPU_ONLY, "float32"),
    ],
)
def test_auto_precision_table(hw, policy):
    p = plan_for(hw)
    assert p.precision == policy
    assert p.reasons["precision"]


def test_auto_precision_never_picks_float16_on_cpu():
    for cpu in (CPU, CPU_BF16):
        assert plan_for(Hardware(cpu=cpu)).precision != "mixed_float16"


def test_explicit_precision_overrides_with_a_warning_when_slow():
    p = plan_for(CPU_ONLY, precision="mixed_float16")
    assert p.precision == "mixed_float16"
    assert any("several times slower" in w for w in p.warnings)
    p = plan_for(gpu_box(1, cc=(7, 0)), precision="mixed_bfloat16")
    assert any("compute capability >= 8.0" in w for w in p.warnings)
    assert plan_for(gpu_box(1), precision="float32").precision == "float32"


def test_auto_keeps_a_mixed_policy_the_user_chose():
    p = plan_for(CPU_ONLY, model=ModelFacts(policy="mixed_float16"))
    assert p.precision == "mixed_float16" and not p.rebuild


def test_rebuild_only_when_a_strategy_needs_its_scope():
    assert not plan_for(CPU_ONLY).rebuild  # float32 on the default strategy
    bf16 = plan_for(Hardware(cpu=CPU_BF16), precision="mixed_bfloat16")
    assert not bf16.rebuild and bf16.precision == "mixed_bfloat16"  # in place
    assert bf16.reasons["rebuild"].code == "rebuild.policy_in_place"
    assert not plan_for(gpu_box(1, cc=(6, 0))).rebuild  # one GPU: default strategy
    assert plan_for(gpu_box(2)).rebuild  # mirrored: variables in its scope
    assert plan_for(gpu_box(1), strategy="one_device").rebuild  # you asked
    assert plan_for(
        gpu_box(1), model=ModelFacts(builder=True), precision="float32"
    ).rebuild


def test_unrebuildable_model_keeps_its_precision_and_drops_the_strategy():
    facts = ModelFacts(rebuildable=False, why_not_rebuildable="subclassed model Net")
    p = plan_for(gpu_box(2), model=facts)
    # The precision is set in place; only the strategy needs a copy.
    assert (p.strategy, p.replicas, p.precision) == ("default", 1, "mixed_bfloat16")
    assert not p.rebuild
    (w,) = [w for w in p.warnings if w.startswith("Not applied")]
    assert "strategy mirrored" in w and "precision" not in w
    assert "subclassed model Net" in w and "zero-argument function" in w


def test_clusters_plan_multi_worker_training():
    two = Hardware(cpu=CPU, cluster=ClusterInfo("TF_CONFIG", 2, "worker", 1))
    p = plan_for(two, batch_size=64)
    assert (p.strategy, p.replicas, p.devices) == ("multi_worker", 2, ("/cpu:0",))
    # The global batch is split: 32 per worker.
    assert (p.micro_batch_size, p.global_batch_size) == (32, 64)
    why = p.reasons["strategy"]
    assert why.code == "strategy.multi_worker"
    assert (why.details["source"], why.details["where"]) == ("TF_CONFIG", "worker 1")
    gpus = dataclasses.replace(gpu_box(4), cluster=ClusterInfo("SLURM", 3, "worker", 0))
    p = plan_for(gpus, batch_size=1200)
    assert (p.strategy, p.replicas, p.micro_batch_size) == ("multi_worker", 12, 100)
    assert p.devices == ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3")
    assert plan_for(two, strategy="multi_worker").strategy == "multi_worker"
    bad = Hardware(
        cpu=CPU, cluster=ClusterInfo("TF_CONFIG", error="TF_CONFIG is not valid JSON")
    )
    with pytest.raises(kerascale.ClusterConfigError, match="not valid JSON"):
        plan_for(bad)
    with pytest.raises(kerascale.ConfigurationError, match="needs a cluster"):
        plan_for(CPU_ONLY, strategy="multi_worker")
    # A one-worker description is not a cluster: training goes ahead.
    one = Hardware(cpu=CPU, cluster=ClusterInfo("SLURM", 1, "worker", 0))
    assert plan_for(one).strategy == "default"
    # And an explicit single-machine strategy goes ahead on a cluster too.
    assert plan_for(two, strategy="one_device").strategy == "one_device"


@pytest.mark.parametrize("task", ["ps", "evaluator"])
def test_tasks_that_do_not_train_synchronously_are_refused(task):
    hw = Hardware(cpu=CPU, cluster=ClusterInfo("TF_CONFIG", 2, task, 0))
    with pytest.raises(kerascale.UnsupportedError, match=f"'{task}' task"):
        plan_for(hw)


def test_a_model_that_cannot_move_to_the_cluster_is_an_error():
    facts = ModelFacts(rebuildable=False, why_not_rebuildable="subclassed model Net")
    two = Hardware(cpu=CPU, cluster=ClusterInfo("TF_CONFIG", 2, "worker", 0))
    with pytest.raises(kerascale.ModelError, match="subclassed model Net"):
        plan_for(two, model=facts)


@pytest.mark.parametrize(
    "data, batch_size, replicas_hw, global_batch, changes",
    [
        (ARRAYS, "auto", CPU_ONLY, 32, {}),
        (ARRAYS, "auto", gpu_box(4), 128, {}),
        (ARRAYS, 100, CPU_ONLY, 100, {}),
        (DataFacts("dataset"), "auto", CPU_ONLY, 32, {"batch": 32}),
        (DataFacts("dataset", True, 16), "auto", CPU_ONLY, 16, {}),
        (
            DataFacts("dataset", True, 16),
            64,
            CPU_ONLY,
            64,
            {"batch": 64, "rebatch_from": 16},
        ),
    ],
)
def test_batch_decisions(data, batch_size, replicas_hw, global_batch, changes):
    p = plan_for(replicas_hw, data=data, batch_size=batch_size, optimize_data=False)
    assert p.global_batch_size == global_batch
    assert p.micro_batch_size * p.replicas * p.accumulation_steps == global_batch
    assert p.data_changes == DataChanges(**changes)


def test_batch_must_divide_across_replicas():
    with pytest.raises(
        kerascale.ConfigurationError,
        match=r"divisible by the number of replicas \(4\).*batch_size=30",
    ):
        plan_for(gpu_box(4), batch_size=30)


def test_optimize_data_changes_are_recorded():
    p = plan_for(CPU_ONLY, data=DataFacts("dataset", True, 32))
    # No map to parallelize.
    assert p.data_changes == DataChanges(prefetch=True, autotune_off=True)
    p = plan_for(CPU_ONLY, data=DataFacts("dataset", True, 32, sequential_map=True))
    expected = DataChanges(parallel_map=True, prefetch=True, autotune_off=True)
    assert p.data_changes == expected
    # Your pipeline's own autotuning option is kept: not turned off.
    p = plan_for(CPU_ONLY, data=DataFacts("dataset", True, 32, autotune_set=True))
    assert p.data_changes == DataChanges(prefetch=True)
    p = plan_for(gpu_box(2), data=DataFacts("dataset", True, 32))
    assert p.data_changes.shard == "data"
    p = plan_for(gpu_box(2), data=DataFacts("dataset", True, 32, from_files=True))
    assert p.data_changes.shard == "file"


def test_data_changes_read_as_the_plan_has_always_printed_them():
    """The one place the words are made (a golden test of their wording)."""
    every = DataChanges(
        materialized=True,
        batch=64,
        rebatch_from=16,
        parallel_map=True,
        prefetch=True,
        cache=True,
        shard="file",
        read_ahead=True,
        by_process=True,
        left_out=3,
        cut_as_read=True,
        autotune_off=True,
    )
    assert every.words() == (
        "materialized",
        "rebatch(16 -> 64)",
        "map parallelization",
        "prefetch(AUTOTUNE)",
        "autotuning off (parallel calls at the cores, up to 16)",
        "cache()",
        "shard by file (by data if fewer files than workers)",
        "read ahead on a thread",
        "each process reads its block of every global batch",
        "last 3 sample(s) of each epoch left out",
        "each batch cut to a multiple of the devices as it is read",
    )
    assert str(DataChanges()) == "unchanged" and DataChanges().words() == ()
    assert every.pipeline == every.words()[:1] + every.words()[2:]
    assert DataChanges.from_saved(every.to_dict()) == every
    assert DataChanges().to_dict() == {}
    with pytest.raises(ValueError, match="shard"):
        DataChanges(shard="rows")


def test_a_checkpoint_s_plan_saved_as_words_reads_back_as_its_changes():
    """Plans saved before `DataChanges` held the words (kerascale 0.1.0,
    until 2026-11-28): such a checkpoint still pins what it chose."""
    old = plan_for(CPU_ONLY).to_dict()
    old["data_changes"] = [
        "rebatch(16 -> 64)",
        "map parallelization",
        "prefetch(AUTOTUNE)",
        "shard by data",
        "read ahead on a thread where a callback waits on each step",
        "a wording no field holds",
    ]
    changes = Plan.from_dict(old).data_changes
    assert changes == DataChanges(
        batch=64,
        rebatch_from=16,
        parallel_map=True,
        prefetch=True,
        shard="data",
        read_ahead=True,
    )


@pytest.mark.parametrize(
    "changes, pinned",
    [
        ({"batch": 32, "parallel_map": True, "prefetch": True}, True),
        # JAX's read-ahead alone (this pinned False before: the checkpoint's
        # plan was searched for "prefetch(AUTOTUNE)", TensorFlow's words).
        ({"batch": 32, "read_ahead": True}, True),
        ({"batch": 64, "rebatch_from": 16}, False),
        ({"materialized": True, "batch": 32}, False),
        ({}, False),
    ],
)
def test_a_resumed_run_keeps_the_pipeline_changes_its_checkpoint_made(changes, pinned):
    saved = dataclasses.replace(plan_for(CPU_ONLY), data_changes=DataChanges(**changes))
    saved = Plan.from_json(saved.to_json())  # as a checkpoint holds it
    options, names = pin(Options.validate(), saved, data_batched=False)
    assert options.optimize_data is pinned and "optimize_data" in names


def test_plan_round_trips_through_json_and_is_frozen():
    p = plan_for(MIXED_GPUS, batch_size=64)
    again = Plan.from_json(p.to_json())
    assert again == p
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.replicas = 3
    with pytest.raises(TypeError):
        p.reasons["strategy"] = "edited"
    with pytest.raises(kerascale.ConfigurationError, match="Unknown Plan field"):
        Plan.from_dict({**p.to_dict(), "bogus": 1})


def test_plan_checks_its_own_arithmetic():
    with pytest.raises(
        kerascale.ConfigurationError, match="global_batch_size must equal"
    ):
        Plan("default", ("/cpu:0",), 2, "float32", 16, 1, 64)


def test_plan_prints_as_a_table_with_reasons():
    plan = plan_for(MIXED_GPUS, batch_size=64)
    text = str(plan)
    assert "strategy   mirrored (2 replicas)" in text
    assert "batch      32 x 2 x 1 = 64" in text
    assert "lowest across GPUs" in " ".join(plan.explain().split())  # wrapped
    assert "warning: GPUs of different types" in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": -1}, "batch_size=-1"),
        ({"batch_size": True}, "batch_size=True"),
        ({"batch_size": 2.5}, "batch_size=2.5"),
        ({"batch_size": "32"}, "batch_size='32'"),
        ({"strategy": "horovod"}, "strategy='horovod'"),
        ({"strategy": 3}, "strategy=3"),
        ({"precision": "float16"}, "precision='float16'"),
        ({"precision": None}, "precision=None"),
        ({"optimize_data": "yes"}, "optimize_data='yes'"),
        ({"verbose": 3}, "verbose=3"),
        ({"verbose": True}, "verbose=True"),
        ({"recompute": "full"}, "recompute='full'"),
        ({"recompute": None}, "recompute=None"),
        ({"recompute": 1.0}, "recompute=1.0"),
    ],
)
def test_options_are_validated_at_the_door(kwargs, message):
    name = next(iter(kwargs))
    with pytest.raises(
        kerascale.ConfigurationError, match=rf"{name} must be .*Received: {message}"
    ):
        Options.validate(**kwargs)
    with pytest.raises(ValueError):  # catchable as the builtin too
        Options.validate(**kwargs)


def _reasons_shown(text):
    """The reason column of each row of a printed plan."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[1:]]
    return [row[2] for row in rows if len(row) == 3 and not row[0].startswith("warn")]


def test_the_plan_reads_at_a_glance_and_explains_in_full():
    """Each reason in at most about 60 characters by default; `explain()`
    has every word of it."""
    long_batch = (
        "data not batched and no batch_size given: Keras's default 32 per "
        "replica (batch search skipped: the search would take about 6.0s; it "
        "may save 25% of a run of about 10s; to search anyway, pass "
        "batch_size=kerascale.find_batch_size(model, data).batch_size)"
    )
    p = plan_for(CPU_ONLY)
    p = dataclasses.replace(p, reasons={**p.reasons, "global_batch_size": long_batch})
    shown = _reasons_shown(p.describe())
    assert shown and all(len(why) <= 60 for why in shown), shown
    assert "Keras's default 32 per replica" in shown
    assert long_batch not in str(p)
    # In full, every word, wrapped at 100 columns under its own column
    # (issue 55: reasons ran to 450 columns on one line).
    full = p.explain().splitlines()
    assert all(len(line) <= 120 for line in full), full
    at = next(i for i, line in enumerate(full) if line.lstrip().startswith("batch"))
    column = full[at].index("data not batched")
    wrapped = [full[at][column:]]
    for line in full[at + 1 :]:
        if line[:column].strip():
            break
        wrapped.append(line[column:])
    assert len(wrapped) > 1 and " ".join(wrapped) == long_batch


def test_brief_keeps_the_statement_and_drops_the_asides():
    from kerascale.plan.plan import brief

    assert brief("you asked for it") == "you asked for it"
    assert (
        brief(
            "float32: the run (about 0.1s) is too short to repay bf16's start "
            "(about 0.03s)"
        )
        == "float32: the run is too short to repay bf16's start"
    )
    assert brief("a" * 30 + "; " + "b" * 40) == "a" * 30
    words = " ".join(["word"] * 30)
    assert brief(words) == " ".join(["word"] * 11) + "\u2026"
    assert len(brief(words)) <= 60


class _Answer:
    """A batch search's answer, as a plan reads it."""

    def __init__(self, per_replica):
        self.per_replica_batch_size, self.cached = per_replica, True
        self.reasons = {"batch_size": f"the fastest the probes timed: {per_replica}"}


def test_a_batch_kerascale_chose_says_what_it_does_to_the_updates():
    """A batch other than model.fit's 32, chosen for arrays, has a row of its
    own: the updates an epoch, before and after, and the two ways to choose
    otherwise, each of which works (issue 55: 85 updates became 9, silently,
    and the loss ended 3x higher)."""
    data = DataFacts("arrays", num_samples=2720)
    plan = make_plan(CPU_ONLY, Options.validate(), FLOAT32, data, search=_Answer(337))
    why = plan.reasons["updates_per_epoch"]
    assert why.code == "batch.updates"
    assert (why.details["before"], why.details["after"]) == (85, 9)
    row = next(ln for ln in str(plan).splitlines() if ln.lstrip().startswith("updates"))
    assert row.split()[1:6] == ["85", "->", "9", "updates", "an"], row
    assert row.split("updates an epoch")[1].split() == [
        "batch_size=32",
        "keeps",
        "Keras's",
    ]
    assert "batch_size=32" in why and "lr_scaling='linear'" in why
    assert "base_batch_size=32" in why
    # Following the first: Keras's batch, no such row.
    kept = make_plan(CPU_ONLY, Options.validate(batch_size=32), FLOAT32, data)
    assert kept.global_batch_size == 32 and "updates_per_epoch" not in kept.reasons
    # Following the second: the rate scaled to the batch chosen, and said.
    scaled = make_plan(
        CPU_ONLY,
        Options.validate(lr_scaling="linear", base_batch_size=32),
        FLOAT32,
        data,
        search=_Answer(337),
    )
    assert scaled.lr_factor == pytest.approx(337 / 32)
    assert "scaled to it, as you asked" in scaled.reasons["updates_per_epoch"]
    # Nothing to say where the updates are the same, or steps_per_epoch sets them.
    assert "updates_per_epoch" not in plan_for(CPU_ONLY).reasons
    steps = dataclasses.replace(data, steps_given=True)
    fixed = make_plan(CPU_ONLY, Options.validate(), FLOAT32, steps, search=_Answer(337))
    assert "updates_per_epoch" not in fixed.reasons


def test_one_cpu_asks_whether_the_model_re_creates_only_where_it_must(monkeypatch):
    """On one CPU under the default strategy nothing re-creates a model
    that measurements can borrow: the round trip of every layer's config
    (0.8 s for a keras-hub task, a one-step fit's planning) is not paid.
    Where a strategy's scope may need it (TensorFlow), it is."""
    from conftest import dense_model, toy_data

    from kerascale.sense import model_facts as facts_lib

    asked = []
    real = facts_lib.recreation_problem
    monkeypatch.setattr(
        facts_lib, "recreation_problem", lambda m: asked.append(m) or real(m)
    )
    x, y = toy_data(32)
    kerascale.plan(dense_model(), x, y, epochs=1, verbose=0)
    assert asked == []
    model = dense_model()
    facts = facts_lib.model_facts(model, "auto", sample=lambda: x[:1], scoped=True)
    assert asked == [model] and facts.rebuildable
