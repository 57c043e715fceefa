"""A plan's reasons: codes that tests and code read, words made in one
place (`kerascale.plan.reasons`). The golden tests at the end are the few
that check the words themselves."""

import dataclasses
import json
import pickle

import pytest
from conftest import CPU, CPU_BF16, gpu_box

from kerascale.plan import reasons
from kerascale.plan.measured import Measured
from kerascale.plan.options import Options
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason
from kerascale.plan.rules import make_plan
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import ClusterInfo, Hardware, TPUInfo
from kerascale.sense.model_facts import ModelFacts

FLOAT32 = ModelFacts(policy="float32")
ARRAYS = DataFacts(kind="arrays", num_samples=100_000)
DATASET = DataFacts(kind="dataset", num_samples=10_000, sequential_map=True)
JAX_CPUS = dataclasses.replace(
    Hardware(cpu=dataclasses.replace(CPU, logical_devices=2)), backend="jax"
)
CLUSTER = Hardware(cpu=CPU, cluster=ClusterInfo("TF_CONFIG", 2, "worker", 1))
TPU_HOST = Hardware(cpu=CPU, tpu=TPUInfo("my-tpu", "TPU_NAME"))

# (hardware, options, data): a spread of the rules' cases.
CASES = [
    (Hardware(cpu=CPU), {}, ARRAYS),
    (Hardware(cpu=CPU_BF16), {"batch_size": 256, "max_batch_size": 64}, ARRAYS),
    (gpu_box(4), {"lr_scaling": "linear", "base_batch_size": 32}, DATASET),
    (gpu_box(1, cc=(7, 0)), {"recompute": True, "optimize_data": False}, DATASET),
    (TPU_HOST, {"accumulation_steps": 2, "batch_size": 64}, ARRAYS),
    (CLUSTER, {"batch_size": 64}, ARRAYS),
    (JAX_CPUS, {}, DataFacts(kind="pydataset", batch_size=16, batched=True)),
    (dataclasses.replace(Hardware(cpu=CPU), backend="jax"), {}, ARRAYS),
    (dataclasses.replace(gpu_box(2), backend="jax"), {}, ARRAYS),
    (Hardware(cpu=CPU), {"recompute": False}, DataFacts(kind="other")),
]


@pytest.mark.parametrize("hw, options, data", CASES)
def test_every_reason_a_rule_gives_has_a_code(hw, options, data):
    plan = make_plan(hw, Options.validate(**options), FLOAT32, data)
    for field, why in plan.reasons.items():
        assert reasons.code(why) in reasons.WORDS, (field, why)
        # Its words are its code's, made from its details (and a note after).
        made = {k: v for k, v in why.details.items() if k not in ("note", "first")}
        assert Reason(why.code, **made) in why, (field, why)


def test_the_rules_codes_for_one_plan():
    plan = make_plan(
        gpu_box(4),
        Options.validate(lr_scaling="linear", base_batch_size=32),
        FLOAT32,
        DATASET,
    )
    codes = {field: why.code for field, why in plan.reasons.items()}
    assert codes == {
        "strategy": "strategy.gpus",
        "precision": "precision.gpu_bf16",
        "rebuild": "rebuild.scope",
        "global_batch_size": "batch.keras_default",
        "accumulation_steps": "accumulation.no_bound",
        "lr_factor": "lr.scaled",
        "data_changes": "data.pipeline",
        "steps_per_execution": "steps.replicas",
    }
    assert plan.reasons["lr_factor"].details["factor"] == 4.0


def test_a_note_and_a_first_keep_the_code_and_add_the_words():
    why = Reason("accumulation.fits")
    noted = why.noted("trials skipped: short")
    assert noted.code == "accumulation.fits"
    assert noted.details["note"] == "trials skipped: short"
    assert noted == "the batch fits in one forward pass (trials skipped: short)"
    first = why.after("materialized to /tmp/x")
    assert (first.code, first) == (
        "accumulation.fits",
        "materialized to /tmp/x; the batch fits in one forward pass",
    )
    # Words alone (a plan read back from JSON) take a note as words.
    assert reasons.noted("", "n") == "n"
    assert reasons.noted("w", "n") == "w (n)" and reasons.code("w (n)") == ""
    assert reasons.after("w", "f") == "f; w"


def test_a_measured_reason_replaces_the_rules_and_keeps_its_code():
    found = Measured().decided(precision=Reason("precision.chief", policy="float32"))
    found = found.noted("global_batch_size", "batch search skipped: short")
    plan = make_plan(
        Hardware(cpu=CPU), Options.validate(), FLOAT32, ARRAYS, measured=found
    )
    assert plan.reasons["precision"].code == "precision.chief"
    batch = plan.reasons["global_batch_size"]
    assert batch.code == "batch.keras_default"
    assert batch.details["note"] == "batch search skipped: short"


def test_a_reason_pickles_with_its_code_and_serialises_as_its_words():
    why = Reason("strategy.gpus", n=2, mixed=True)
    back = pickle.loads(pickle.dumps(why))
    assert (back.code, dict(back.details), back) == (
        why.code,
        {"n": 2, "mixed": True},
        why,
    )
    plan = make_plan(gpu_box(2), Options.validate(), FLOAT32, ARRAYS)
    read = Plan.from_json(plan.to_json())
    assert read == plan  # the same words
    assert json.loads(plan.to_json())["reasons"]["strategy"] == "2 GPUs of one type"
    assert reasons.code(read.reasons["strategy"]) == ""  # JSON keeps words only


def test_an_unknown_code_or_a_missing_detail_is_a_programming_error():
    with pytest.raises(KeyError):
        Reason("no.such.code")
    with pytest.raises(KeyError):
        Reason("batch.capped", why="x")  # samples missing


# The golden tests: the words a user reads, for a few codes.
@pytest.mark.parametrize(
    "code, details, words",
    [
        ("strategy.gpus", {"n": 4, "mixed": False}, "4 GPUs of one type"),
        (
            "strategy.multi_worker",
            {"source": "SLURM", "workers": 3, "devices": 1, "where": "", "asked": True},
            "SLURM: 3 workers x 1 device; you asked for it",
        ),
        (
            "precision.gpu_fp16",
            {"spelled": "7.5", "lowest": True},
            "GPU compute capability 7.5 (lowest across GPUs): float16 tensor cores, "
            "with dynamic loss scaling",
        ),
        (
            "accumulation.inexact",
            {"per_replica": 100, "bound": 40, "least": 20, "k": 3, "micro": 33},
            "100 per replica does not fit (at most 40) and has no split into equal "
            "micro-batches of at least 20: 3 x 33 = 99 per replica instead",
        ),
        (
            "lr.scaled",
            {
                "scaling": "sqrt",
                "rule": "sqrt(B/base)",
                "effective": 128,
                "base": 32,
                "where": "base_batch_size",
                "factor": 2.0,
            },
            "lr_scaling='sqrt': sqrt(B/base) = 128/32 (base_batch_size) -> x2",
        ),
        (
            "first_step_failed",
            {
                "what": "precision mixed_bfloat16",
                "failure": "TypeError: x",
                "skip": {"precision": "float32"},
            },
            "precision mixed_bfloat16 failed at the first training step (TypeError: "
            "x): training without them. Pass precision='float32' to skip the attempt.",
        ),
        (
            "limit.device_free",
            {"passed": False, "limit": "79.0 GiB", "used": "1.2 GiB"},
            "XLA's allocator limit 79.0 GiB less 1.2 GiB in use",
        ),
        (
            "precision.cpu_by_trial",
            {"why": "JAX on CPU: no faster"},
            "JAX on CPU: no faster: float32, unless the trials time your model "
            "faster in mixed_bfloat16; pass precision='mixed_bfloat16' to use it "
            "anyway",
        ),
        (
            "trials.measured",
            {
                "field": "data_changes",
                "cached": True,
                "rounds": 3,
                "figures": "as given: 100 ± 1%; optimised: 150 ± 2%",
                "gain": 0.03,
                "attempts": 1,
                "max_attempts": 3,
                "uncertain": True,
                "optimized": True,
            },
            "optimised: measured on your data (cached trials, 3 interleaved rounds, "
            "samples/s ± half their range: as given: 100 ± 1%; optimised: 150 ± 2%; "
            "the alternative to what model.fit does only when it wins in every "
            "round, by more than 3% and half the range of the per-round gains); "
            "within noise: measured again on a later run (1 of 3)",
        ),
    ],
)
def test_the_words_of_a_few_codes(code, details, words):
    assert Reason(code, **details) == words


GOLDEN = """\
kerascale plan (batch = micro x replicas x accumulation = global)
  hardware   CPU (Test CPU, 8 cores, bf16)
  backend    tensorflow                     Keras's backend (KERAS_BACKEND); distributed with
                                            tf.distribute
  strategy   default (1 replica)            CPU only: TensorFlow's default strategy
  precision  float32                        TensorFlow on CPU: bf16 runs faster for some models only
                                            (an MLP 0.6-0.8x float32's speed, a CNN 0.95x, a Conv1D
                                            1.1-1.4x on an AVX512_BF16 CPU): float32, unless the
                                            trials time your model faster in mixed_bfloat16; pass
                                            precision='mixed_bfloat16' to use it anyway
  batch      32 x 1 x 1 = 32                data not batched and no batch_size given: Keras's
                                            default 32 per replica
  model      yours, as it is                already matches the plan: zero overhead
  data       unchanged                      arrays are batched and prefetched by Keras itself"""  # noqa: E501


def test_a_plan_reads_as_it_did():
    plan = make_plan(Hardware(cpu=CPU_BF16), Options.validate(), FLOAT32, ARRAYS)
    assert plan.explain() == GOLDEN
    # Every line fits 100 columns, whatever the CPU's name (issue 81).
    assert max(len(line) for line in GOLDEN.splitlines()) <= 100


def test_a_plan_fits_100_columns_whatever_its_values():
    """A CPU's long name, a long data value and long reasons wrap under
    their row (issue 81: 143 columns on TensorFlow, 167 on JAX)."""
    cpu = dataclasses.replace(CPU_BF16, model="Intel(R) Xeon(R) " + "Platinum " * 7)
    plan = make_plan(Hardware(cpu=cpu), Options.validate(), FLOAT32, ARRAYS)
    reasons_ = {**plan.reasons, "data_changes": "because " * 40}
    plan = dataclasses.replace(plan, reasons=reasons_)
    for text in (plan.describe(), plan.explain()):
        assert max(len(line) for line in text.splitlines()) <= 100, text
    lines = plan.explain().splitlines()
    assert lines[1].startswith("  hardware   CPU (Intel(R)"), lines
    assert lines[2].startswith("             Platinum"), lines  # under its row
    assert " ".join(plan.explain().split()).count("because") == 40


def test_a_plan_shows_itself_as_a_notebook_cell_s_value():
    """As a cell's last line: the table, through IPython's pretty printer
    and as HTML (aligned in <pre>); `repr` stays the dataclass's."""
    plan = make_plan(Hardware(cpu=CPU_BF16), Options.validate(), FLOAT32, ARRAYS)
    shown = []

    class Printer:  # IPython's printer, as `_repr_pretty_` receives it
        def text(self, text):
            shown.append(text)

    plan._repr_pretty_(Printer(), False)
    assert shown == [str(plan)]
    # IPython takes the first `_repr_pretty_` or `__repr__` a class of the
    # object defines, and a dataclass defines `__repr__`: each report's own
    # class must define `_repr_pretty_` (a notebook showed the repr).
    from kerascale.diagnose import Diagnosis
    from kerascale.measure.result import BatchSearchResult

    for report in (Plan, BatchSearchResult, Diagnosis):
        assert "_repr_pretty_" in report.__dict__, report
    page = plan._repr_html_()
    assert page.startswith("<pre>kerascale plan") and page.endswith("</pre>")
    assert "Keras&#x27;s backend" in page  # escaped
    assert repr(plan).startswith("Plan(strategy=")
    assert Plan.from_dict(plan.to_dict()) == plan


def test_what_a_run_prints_fits_100_columns():
    """A line kerascale prints in a run (a batch growing, a resume, the
    trials' cost) wraps at 100 columns, its later lines indented."""
    from kerascale._display import said

    text = said("kerascale: batch 32 -> 128 from the next epoch " + "(why) " * 30)
    lines = text.splitlines()
    assert len(lines) > 1 and max(len(line) for line in lines) <= 100
    assert all(line.startswith("  ") for line in lines[1:])
    assert said("kerascale: short") == "kerascale: short"
