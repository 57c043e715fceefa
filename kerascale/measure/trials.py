"""Measuring, before committing, the decisions a rule can get wrong on a CPU.

On a CPU with native bf16, `mixed_bfloat16` usually steps faster, and a
prefetched pipeline with parallel maps usually feeds the model faster. Not
always: on 2 cores a parallel map competes with the model for the same cores,
and a BatchNorm-heavy model gains little from bf16 (measured: every
configuration within 10% of plain Keras, and plain Keras the fastest). So
where the user left the choice to kerascale and the host is a CPU, the
candidates train a copy of the model for about three seconds each, on the real data
at the planned batch, and the fastest wins. The decision is cached, like the
batch search, so a second `fit` measures nothing.

Trials are coordinate-wise: the batch first (each rung of the batch search's
ladder, the two fastest timed twice), then the input pipeline (optimised or as
given), then float32 against the rule's mixed policy. On GPUs and TPUs the rules are
kept: mixed precision on tensor cores and a prefetching pipeline are reliably
faster there, and trials would cost device memory.
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Any

import keras

from kerascale.apply import model as model_lib
from kerascale.apply.model import CannotRecreate
from kerascale.apply.session import Session, prepare
from kerascale.measure import cache
from kerascale.plan import strategy as strategy_rules
from kerascale.sense import data_facts
from kerascale.sense.model_facts import gist

# Timed per candidate after a warm-up of at least WARMUP_STEPS steps and
# WARMUP_SECONDS (tracing, then tf.data's autotuning of a fresh pipeline: 1 s
# trials after 2 steps put batch 64 at half its real speed on 2 cores).
TRIAL_SECONDS = 2.5
WARMUP_STEPS = 2
WARMUP_SECONDS = 0.5
SPEED_TOLERANCE = 0.03  # a smaller batch within 3% of the fastest is preferred


@dataclasses.dataclass(frozen=True)
class Trial:
    batch: int  # per replica
    precision: str
    optimize_data: bool
    samples_per_s: float
    failed: str = ""  # why the candidate could not train, if it could not

    def describe(self) -> str:
        pipe = "optimised pipeline" if self.optimize_data else "pipeline as given"
        result = (
            f"failed ({self.failed})"
            if self.failed
            else f"{self.samples_per_s:.0f} samples/s"
        )
        return f"{self.batch}, {self.precision}, {pipe}: {result}"


@dataclasses.dataclass(frozen=True)
class TrialResult:
    batch: int
    precision: str
    optimize_data: bool
    trials: tuple[Trial, ...]
    cached: bool = False

    def why(self, field: str) -> str:
        """The reason for `field` of the plan, with every trial's figure."""
        source = "cached trials" if self.cached else "trials"
        if field == "batch":
            first = self.trials[0]
            per_batch: dict[int, list[float]] = {}
            for t in self.trials:
                if (t.precision, t.optimize_data) == (
                    first.precision,
                    first.optimize_data,
                ):
                    per_batch.setdefault(t.batch, []).append(t.samples_per_s)
            figures = ", ".join(
                f"{b}: " + " & ".join(f"{v:.0f}" for v in vs)
                for b, vs in per_batch.items()
            )
            return (
                f"measured on your data ({source}, samples/s: {figures}; the two "
                f"fastest timed twice): the smallest within {SPEED_TOLERANCE:.0%} "
                "of the fastest mean"
            )
        ran = "; ".join(t.describe() for t in self.trials if t.batch == self.batch)
        if field == "precision":
            return f"measured fastest here ({source}: {ran})"
        return (
            f"{'optimised' if self.optimize_data else 'left as given'}: measured "
            f"fastest here ({source}: {ran})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "precision": self.precision,
            "optimize_data": self.optimize_data,
            "trials": [dataclasses.asdict(t) for t in self.trials],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        return cls(
            d["batch"],
            d["precision"],
            d["optimize_data"],
            tuple(Trial(**t) for t in d["trials"]),
            cached=True,
        )


def possible(options: Any, hw: Any, model: Any) -> bool:
    """Trials run on a CPU host, for a model kerascale can copy (or train
    and put back), under a strategy it builds itself; not on a cluster, whose
    workers would time them differently and could choose differently."""
    return (
        hw.accelerator == "cpu"
        and isinstance(options.strategy, str)
        and model.measurable
        and not strategy_rules.wants_cluster(hw, options.strategy)
    )


def wanted(options: Any, plan: Any, data: Any, x: Any) -> tuple[bool, bool]:
    """(try the pipeline, try the precision): the choices left to kerascale
    where the alternatives differ."""
    pipeline = (
        options.optimize_data == "auto"
        and data.kind == "dataset"
        and data_facts.has_map(x)
    )
    precision = (
        options.precision == "auto"
        and plan.precision != "float32"
        and data.kind != "pydataset"
    )
    return pipeline, precision


def run(
    model: Any,
    x: Any,
    y: Any,
    data: Any,
    plan: Any,
    hw: Any,
    *,
    try_pipeline: bool,
    try_precision: bool,
    batches: tuple[int, ...] = (),
    optimize: bool = True,
    verbose: Any = "auto",
    fresh: bool = False,
) -> TrialResult:
    """Measures the candidates and returns the fastest (cached).

    Args:
        batches: Per-replica batches known to fit (the batch search's rungs),
            to time on the real data; empty to keep the plan's batch.
        optimize: The pipeline setting when it is not tried.
        fresh: Measure again even when the cache has an answer (which the
            new measurement then replaces).
    """
    key = cache.cache_key(
        {
            "trials": 2,
            "model": cache.model_fingerprint(model),
            "data": data_facts.signature(x),
            "plan": [plan.precision, plan.step_batch_size, plan.strategy],
            "candidates": [try_pipeline, try_precision, list(batches), optimize],
            "hardware": hw.to_dict(),
        }
    )
    cached = None if fresh else cache.cache_read("trials", key)
    if cached is not None:
        try:
            return TrialResult.from_dict(cached)
        except (KeyError, TypeError):
            pass  # an entry from another version: measure again
    if verbose != 0:
        print(
            "kerascale: timing the candidates on your data, about 3 s each (cached)...",
            flush=True,
        )

    def measure(batch, policy, pipe):
        try:
            t = _measure(model, x, y, data, plan, batch, policy, pipe)
        except CannotRecreate:
            raise  # the model cannot be copied at all: decide re-plans
        except Exception as e:  # the candidate cannot train: it is dropped
            t = Trial(batch, policy, pipe, 0.0, f"{type(e).__name__}: {gist(e)}")
        if verbose != 0:
            print(f"kerascale: trial: {t.describe()}", flush=True)
        trials.append(t)
        return t

    trials: list[Trial] = []
    batch, policy, pipe = plan.micro_batch_size, plan.precision, optimize
    if try_pipeline:
        pipe = True
    if len(batches) > 1:
        batch = _fastest(batches, lambda b: measure(b, policy, pipe), batch)
    if try_pipeline:
        here = _find(trials, batch, policy, True) or measure(batch, policy, True)
        other = measure(batch, policy, False)
        pipe = here.samples_per_s >= other.samples_per_s
    if try_precision:
        here = _find(trials, batch, policy, pipe) or measure(batch, policy, pipe)
        other = measure(batch, "float32", pipe)
        if other.samples_per_s > here.samples_per_s:
            policy = "float32"
    result = TrialResult(batch, policy, pipe, tuple(trials))
    cache.cache_write("trials", key, result.to_dict())
    return result


def _fastest(batches: tuple[int, ...], measure: Any, default: int) -> int:
    """The smallest batch within SPEED_TOLERANCE of the fastest mean, each
    rung timed once and the two fastest again; `default` if all failed."""
    speeds = {b: [measure(b).samples_per_s] for b in batches}
    # One timing of a few seconds varies by 15% on a busy 2-core machine:
    # the two fastest rungs are timed again, in the other order, and each
    # rung is judged by its mean.
    leaders = sorted(batches, key=lambda b: -speeds[b][0])[:2]
    for b in reversed(leaders):
        speeds[b].append(measure(b).samples_per_s)
    mean = {b: sum(v) / len(v) for b, v in speeds.items()}
    top = max(mean.values())
    if top <= 0:  # every rung failed: the search's batch stands
        return default
    return min(b for b, v in mean.items() if v >= (1 - SPEED_TOLERANCE) * top)


def _find(trials: list[Trial], batch: int, policy: str, pipe: bool) -> Trial | None:
    return next(
        (
            t
            for t in trials
            if (t.batch, t.precision, t.optimize_data) == (batch, policy, pipe)
        ),
        None,
    )


def _measure(
    model: Any,
    x: Any,
    y: Any,
    data: Any,
    plan: Any,
    batch: int,
    policy: str,
    optimize: bool,
) -> Trial:
    """Trains a copy of `model` under `policy` on the real data for about
    TRIAL_SECONDS after a warm-up, and returns its samples/s. The copy is
    prepared on `fit`'s own path; the user's model, random state and dtype
    policy are left as they were.

    Raises:
        model.CannotRecreate: When the candidate needs a re-created model
            and it cannot be made (`decide` then plans without one).
    """
    import gc

    view = dataclasses.replace(
        plan,
        precision=policy,
        micro_batch_size=batch,
        accumulation_steps=1,
        global_batch_size=batch * plan.replicas,
        lr_factor=1.0,
        rebuild=plan.rebuild or policy != plan.precision,
    )
    decided = types.SimpleNamespace(
        plan=view, data=data, instance=None, optimize_data=optimize
    )
    clock = _Clock()
    with Session() as session:
        session.enter(model_lib.preserved_state())
        prepared = prepare(session, model, x, y, decided, copy=True, as_dataset=True)
        ds = prepared.x
        # Timed as training runs: whole epochs, each with the start-up of its
        # input pipeline (which matters when epochs are short and batches
        # large), unless the data never ends.
        finite = int(ds.cardinality()) >= 0
        prepared.model.fit(
            ds if finite else ds.repeat(),
            epochs=100_000 if finite else 1,
            steps_per_epoch=None if finite else 100_000,
            verbose=0,
            shuffle=False,  # Keras ignores it for a dataset, with a warning
            callbacks=[clock],
        )
        del prepared
    gc.collect()
    return Trial(batch, policy, optimize, clock.speed(batch * plan.replicas))


class _Clock(keras.callbacks.Callback):
    """Marks each batch's end; stops training TRIAL_SECONDS after a warm-up
    of at least WARMUP_STEPS steps and WARMUP_SECONDS."""

    def __init__(self):
        super().__init__()
        self.marks: list[float] = []
        self.start: int | None = None

    def on_train_batch_end(self, batch, logs=None):
        marks = self.marks
        marks.append(time.perf_counter())
        if self.start is None:
            warm = marks[-1] - marks[0] >= WARMUP_SECONDS
            if len(marks) >= WARMUP_STEPS and warm:
                self.start = len(marks) - 1
        elif marks[-1] - marks[self.start] >= TRIAL_SECONDS:
            self.model.stop_training = True

    def speed(self, samples_per_step: int) -> float:
        """Samples/s over the timed steps."""
        marks = self.marks
        first = self.start if self.start is not None else len(marks) - 1
        steps = len(marks) - 1 - first
        seconds = marks[-1] - marks[first] if steps > 0 else 0.0
        return steps * samples_per_step / seconds if seconds > 0 else 0.0
