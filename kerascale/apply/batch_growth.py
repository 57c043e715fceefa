"""The batch that trains best per second, grown inside the run: a `Lever`
of the run's controller (issue 78).

At each epoch's end it times the epoch (a batch's first, which compiles,
apart), measures the gradient noise scale on the
training arrays (`gradient_noise.sample`: no trace in training), and asks
`goodput.grow` for the batch of the rest of the run. A new batch starts at
the next epoch, its learning rate scaled by the optimizer's rule
(`goodput.rule_of`); under the linear rule the batch at most doubles an
epoch, so the rate rises in steps no larger than the rule's at a doubling
(a warmup by epochs); under the square root it may grow up to 8x at once.
When the run ends the optimizer's learning rate is put back, as a rate at
your batch (a `ReduceLROnPlateau`'s cuts kept).

A batch's step is timed once past its first epoch (which compiles). At the
run's first epoch's end the steps lever (`steps_in_run`) has timed the base
batch's step already, its first call apart: where that lever moves, the
batch may move with it, in one new segment and one compile for both
(`first_timing`), two epochs sooner than alone. On issue 78's tabular task
run 12 epochs without `EarlyStopping` (TensorFlow, 2 cores) the batch went
32 -> 128 there, and the run took 4.5-4.8 s against 7.8-8.0 s when it
waited (the batch never grew) and 12-13 s for plain `fit`, at plain's
validation loss or lower.

`wanted` says whether a run can grow its batch, and why not where it
cannot; the batch is then the one the plan chose, as before.

Its design: docs/design/modules.md, `kerascale.apply.batch_growth`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import keras

from kerascale import _keras_compat as keras_compat
from kerascale._display import said
from kerascale.apply import gradient_noise, steps_in_run
from kerascale.apply.controller import Controller, Lever
from kerascale.apply.model import core_optimizer
from kerascale.errors import warn
from kerascale.plan import goodput
from kerascale.plan import reasons as reasons_lib
from kerascale.plan.plan import Plan
from kerascale.plan.reasons import Reason
from kerascale.sense import callback_hooks
from kerascale.sense.backend import traits
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import borrow_problem, is_builder

# Micro-batches of each noise measurement (of the base batch each).
PARTS = 8
# Steps an epoch needs for its time to count.
TIMED_STEPS = 4
# The noise measurements may take at most this share of the run's training
# time so far (the first is always taken): an epoch's end skips one beyond
# it. A CNN's (the quickstart's, JAX) took 0.06 s of a 0.45 s epoch.
MEASURE_SHARE = 0.05
# Doublings one change may make where the rate follows the square root (x8
# the batch, x2.8 the rate: one compile, not three); the linear rule doubles
# at most, a warmup by epochs.
MAX_DOUBLINGS = 3
# Keras's callbacks that set the learning rate by the epoch, in absolute
# terms: a scaled rate would be overwritten (ReduceLROnPlateau's cuts are
# relative, and kept).
_SETS_THE_RATE = (keras.callbacks.LearningRateScheduler,)


@dataclasses.dataclass(frozen=True)
class Facts:
    """What decides whether a run's batch may grow, as `fit` knows it.

    Attributes:
        model: The model that trains (or the user's builder).
        batch_size: `fit`'s `batch_size` argument ("auto" or yours).
        max_batch_size: `fit`'s bound on the batch, or None.
        data: The training data's facts.
        hardware: The hardware sensed.
        plan: The plan decided.
        clustered: Whether the run joined a cluster.
        fit_kwargs: `model.fit`'s other arguments (its callbacks among them).
        backup: The `FaultTolerantBackup` of `fit`'s `checkpoint_dir`, which
            keeps the lever's state (`Levers.checkpointed`), or None.
    """

    model: Any
    batch_size: Any
    max_batch_size: int | None
    data: DataFacts
    hardware: Hardware
    plan: Plan
    clustered: bool
    fit_kwargs: Mapping[str, Any]
    backup: Any = None

    @property
    def callbacks(self) -> list[Any]:
        return list(self.fit_kwargs.get("callbacks") or [])


def reason(facts: Facts) -> Reason | None:
    """Whether the batch grows in the run, as the plan's reason: None where
    the batch is not kerascale's to grow (yours, a batched dataset's, a
    GPU's or TPU's search's); "kept", and why, where growing it is not
    built (several processes, a tf.distribute strategy's replicas, a model
    sharded, accumulation) or the run cannot measure it. The devices of one
    JAX process (`data_parallel`) grow it as one: the global batch doubles,
    each replica's with it. A `checkpoint_dir` keeps the batch and its learning rate's
    factor in each checkpoint (`BatchGrowth.state`), and a resume goes on
    from them."""
    plan, data, hardware = facts.plan, facts.data, facts.hardware
    if (
        facts.batch_size != "auto"
        or data.kind != "arrays"
        or hardware.gpus
        or hardware.tpu is not None
        or is_builder(facts.model)
    ):
        return None
    cluster = hardware.cluster
    not_built = (
        (
            facts.clustered or (cluster is not None and cluster.is_multi_worker),
            "it trains on several processes",
        ),
        (
            plan.replicas != 1 and traits(plan.backend).engine == "tf.distribute",
            f"it trains on {plan.replicas} replicas of a tf.distribute strategy",
        ),
        (plan.strategy == "model_parallel", "it shards the model"),
        (plan.accumulation_steps != 1, "it accumulates gradients"),
    )
    for applies, why in not_built:
        if applies:
            return Reason("growth.kept", why=f"{why} (growing it there is not built)")
    why = wanted(
        facts.model,
        batch=plan.step_batch_size,
        samples=data.num_samples,
        fit_kwargs=facts.fit_kwargs,
        callbacks=[c for c in facts.callbacks if c is not facts.backup],
    )
    if why:
        return Reason("growth.kept", why=why)
    rule = goodput.rule_of(facts.model.optimizer)
    return Reason("growth.in_run", scaling=rule.scaling, family=rule.why)


def lever_for(
    facts: Facts,
    x: Any,
    y: Any,
    plan: Plan,
    *,
    say: Any = None,
    saved: Mapping[str, Any] | None = None,
    pace: Any = None,
) -> tuple[BatchGrowth | None, Reason | None]:
    """The batch lever, where `reason` lets the batch grow, and that reason.
    `x`, `y`: the training arrays; `plan`: the plan that trains (its batch
    is the lever's base); `say`: where a change is told; `saved`: the
    lever's state in the checkpoint the run resumes; `pace`: the run's
    steps lever, if any (`BatchGrowth`). Where that batch grew
    and growing is not wanted now (a callback of yours that acts per batch
    joined, say), the lever still resumes it, and grows it no more."""
    why = reason(facts)
    grows = why is not None and reasons_lib.code(why) == "growth.in_run"
    if not grows and not (grown(saved) and facts.batch_size == "auto"):
        return None, why
    callbacks, kwargs = facts.callbacks, facts.fit_kwargs
    lever = BatchGrowth(
        x,
        y,
        kwargs.get("sample_weight"),
        samples=facts.data.num_samples,
        batch=plan.step_batch_size,
        ceiling=facts.max_batch_size or facts.data.num_samples,
        validation=kwargs.get("validation_batch_size"),
        stoppers=tuple(
            c for c in callbacks if isinstance(c, keras.callbacks.EarlyStopping)
        ),
        say=say,
        pace=pace,
    )
    lever.stopped = not grows
    return lever, why


def grown(state: Mapping[str, Any] | None) -> bool:
    """Whether a checkpoint's lever `state` (`BatchGrowth.state`, or None)
    is at a batch other than the one its run began at."""
    return bool(state) and state.get("batch") != state.get("base")


def followed(controller: Controller, counters: tuple[Any, ...]) -> None:
    """Has `counters` (callbacks that count samples by their `batch_size`,
    a `Throughput`) follow the batch of `controller`'s run."""
    for counter in counters:
        controller.followers.append(functools.partial(_follow, counter))


def _follow(counter: Any, arguments: Mapping[str, Any]) -> None:
    if "batch_size" in arguments:
        counter.batch_size = arguments["batch_size"]


def wanted(
    model: Any,
    *,
    batch: int,
    samples: int | None,
    fit_kwargs: Mapping[str, Any],
    callbacks: list[Any],
) -> str:
    """ "" where a run of `model` at `batch` on `samples` training arrays can
    grow its batch, else why not (in words that follow "the batch stays:").
    """
    optimizer = getattr(model, "optimizer", None)
    rule = goodput.rule_of(optimizer) if optimizer is not None else None
    if rule is None:
        name = type(optimizer).__name__ if optimizer is not None else "none"
        return f"no learning-rate rule is known for your optimizer ({name})"
    rate = keras_compat.learning_rate_object(core_optimizer(optimizer))
    if not isinstance(rate, keras.Variable):
        return (
            "your learning rate is a schedule or a function, which counts steps "
            "at your batch"
        )
    problem = borrow_problem(model)
    if problem:
        return f"the noise scale cannot be measured: {problem}"
    for name in ("steps_per_epoch", "class_weight"):
        if fit_kwargs.get(name) is not None:
            return f"{name} is given, which counts at your batch"
    epochs = fit_kwargs.get("epochs", 1) - fit_kwargs.get("initial_epoch", 0)
    if not isinstance(epochs, int) or epochs < 3:
        return "the run has fewer than 3 epochs: too short to measure and change"
    if samples is None or samples < 2 * batch * goodput.MIN_UPDATES:
        return (
            f"an epoch of {samples} samples has room for no larger batch with "
            f"{goodput.MIN_UPDATES} updates"
        )
    hook = callback_hooks.overridden_hook(callbacks)
    if hook is not None:
        return f"{hook[0]} acts per batch ({hook[1]}), counting batches of yours"
    for callback in callbacks:
        if isinstance(callback, _SETS_THE_RATE) or getattr(
            callback, "sets_learning_rate", False
        ):
            return f"{type(callback).__name__} sets the learning rate by the epoch"
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            return "BackupAndRestore resumes at your batch"
        if hasattr(callback, "saved_levers"):  # a FaultTolerantBackup of yours
            return (
                f"{type(callback).__name__} in callbacks resumes at your batch "
                "(kerascale.fit's checkpoint_dir= keeps a grown batch)"
            )
    return ""


class FirstTiming(NamedTuple):
    """What the batch lever's first decision rests on (`first_timing`):
    seconds of the base batch's training step for the rest of the run,
    of moving to a new batch, and of the first noise measurement."""

    step: float
    switch: float
    measure: float


class BatchGrowth(Lever):
    """Grows the batch of a run on arrays where goodput rises.

    Args:
        x, y, sample_weight: The training arrays (`fit`'s, before any
            `validation_split`).
        samples: Training samples an epoch (after `validation_split`).
        batch: The batch the run starts at (the base of goodput).
        ceiling: The largest batch it may grow to.
        validation: The validation's batch (yours, or the run's first).
        stoppers: The run's `EarlyStopping` callbacks: the rest of the run
            is counted to the earliest epoch one could stop it at.
        say: Where a change is told (`print`, or nothing).
        pace: The run's steps lever (`steps_in_run.StepsInRun`), or None.
            Where it times the run's first epoch, the batch may move at
            that epoch's end, with the steps per call: one new step to
            compile for both, where alone the batch waits for its base to
            be timed past a first epoch (`first_timing`).
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        *,
        samples: int,
        batch: int,
        ceiling: int,
        validation: int | None = None,
        stoppers: tuple[Any, ...] = (),
        say: Any = None,
        pace: steps_in_run.StepsInRun | None = None,
    ):
        super().__init__()
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.samples, self.base, self.batch = samples, batch, batch
        self.ceiling = min(ceiling, samples // goodput.MIN_UPDATES)
        self.validation = validation or batch
        self.stoppers = tuple(stoppers)
        self.say, self.pace = say, pace
        self.scale = goodput.NoiseScale()
        self.timings = EpochTimes()
        self.growths: list[tuple[int, goodput.Growth]] = []
        self.factor = 1.0
        self.stopped = False
        self.measure_seconds = 0.0
        self.compute_seconds: float | None = None
        self._before = batch
        self.taken = 0
        self._rule = None
        self._epoch_start = self._validation = self._test_begin = 0.0
        self._steps_per_call = 1

    def on_train_begin(self, logs=None):
        self._rule = goodput.rule_of(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._validation = 0.0

    # The validation runs at the batch the run began with, whatever the
    # training's: its time is left out of a step's.
    def on_test_begin(self, logs=None):
        self._test_begin = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._test_begin:
            self._validation += time.perf_counter() - self._test_begin
            self._test_begin = 0.0

    def on_epoch_end(self, epoch, logs=None):
        # The whole epoch, validation in: on JAX the steps are dispatched
        # ahead, and only the epoch's end waits for them all.
        steps = self.params.get("steps") or 0
        n = getattr(self.model, "steps_per_execution", 1)
        if n != self._steps_per_call:
            # The steps per call moved (`steps_in_run`): this batch's epochs
            # before are another step's time; this one is its first again.
            self.timings.moved(self.batch)
            self._steps_per_call = n
        seconds = time.perf_counter() - self._epoch_start - self._validation
        self.timings.add(self.batch, seconds, steps)
        if self._measures(epoch):
            began = time.perf_counter()
            try:
                self._measure()
            except Exception as e:  # the run trains on at its batch
                self.stopped = True
                warn(
                    f"Not applied: batch growth, because measuring the noise "
                    f"scale failed ({type(e).__name__}: {str(e)[:200]}): the "
                    f"batch stays {self.batch} for the rest of the run. To "
                    "choose the batch yourself, pass batch_size=."
                )
            self.measure_seconds += time.perf_counter() - began
        if logs is not None:
            logs["batch_size"] = self.batch
            noise = self.scale.value
            logs["noise_scale"] = math.nan if noise is None else noise

    def _measure(self) -> None:
        """One noise sample of 8 micro-batches of the base batch. The first
        also takes one of 3 micro-batches of twice the base: from the two,
        the passes of `base` more samples (`compute_seconds`), each
        micro-batch's fixed cost (a call, fetching the gradient) cancelled
        out. A sample's first micro-batch may compile: left out."""
        sizes = [(self.base, PARTS)]
        if self.compute_seconds is None:
            sizes.append((2 * self.base, 3))
        fastest = {}
        for small, parts in sizes:
            span = small * parts
            start = (self.taken * span) % (self.samples - span + 1)
            chunks: list[float] = []
            sample = gradient_noise.sample(
                self.model,
                self.x,
                self.y,
                self.sample_weight,
                small=small,
                parts=parts,
                start=start,
                seconds=chunks,
            )
            self.scale.add(sample)
            fastest[small] = min(chunks[1:])
        self.taken += 1
        if 2 * self.base in fastest:
            more = fastest[2 * self.base] - fastest[self.base]
            self.compute_seconds = max(more, 0.0)

    def _measures(self, epoch: int) -> bool:
        """Whether to measure the noise scale at `epoch`'s end: the first
        time, once the base's step is timed (`first_timing`) where even a
        doubling that cost no efficiency and no step time (half the rest of
        the run saved) would repay a compile for it and one for the
        measurement; later, once the batch is timed past its first epoch,
        while the measurements are within `MEASURE_SHARE` of the run's
        time. Never at the run's last epoch, nor once the batch can grow no
        more."""
        if self.stopped or epoch + 1 >= self.params.get("epochs", 0):
            return False
        if 2 * self.batch > self.ceiling:
            return False
        if not self.taken:
            first = self.first_timing(epoch)
            if first is None:
                return False
            best = self._epochs_left(epoch) * first.step * self.params["steps"] / 2
            return best > first.switch + first.measure
        if not self.timings.settled(self.batch):
            return False
        return self.measure_seconds <= MEASURE_SHARE * self.timings.seconds()

    def first_timing(self, epoch: int) -> FirstTiming | None:
        """The base batch's training step for the rest of the run and what
        moving to a new batch and a first noise measurement cost, or None
        while none is timed: from the base's own epochs once past its
        first, else from the steps lever's timing of the run's first epoch
        (its first call apart), where `epoch` is it. Where the steps lever
        moves at that epoch's end, the step is the one at its new value (the
        host's path per call saved), and the new batch's step compiles in
        the compile that move pays."""
        steady = self.timings.steady()
        if self.base in steady:
            switch = self.timings.switch_seconds()
            return FirstTiming(steady[self.base], switch, switch)
        at_one = self.pace.timed_at_one() if self.pace is not None else None
        if at_one is None or self.batch != self.base or len(self.pace.epochs) != 1:
            return None
        k = self.pace.would_move(epoch)
        step = at_one.training_step - self.pace.saved_per_step(k or 1)
        # A compile (the new batch's, the measurement's gradients') is
        # counted at most what the training's first call took beyond a step
        # (a retrace took 0.5-0.55 of it on issue 78's tabular and sequence
        # tasks, TensorFlow).
        compile_seconds = at_one.train_excess
        if k is None:
            switch = at_one.first_excess + steps_in_run.RESTART_SECONDS
        else:  # joined: only a last, shorter batch compiles once more
            largest = self.batch * 2 ** self._doublings()
            switch = compile_seconds if self.samples % largest else 0.0
        return FirstTiming(step, switch, compile_seconds)

    def _epochs_left(self, epoch: int) -> int:
        """The epochs after `epoch` that a change is sure to be repaid over:
        to the run's end, or to the earliest an `EarlyStopping` could stop
        it (its patience less the epochs it has waited). Counting to the
        run's end while the monitor still improves was measured
        (benchmarks/time_to_accuracy.py, 2026-12-06): issue 78's tabular
        notebook then grew 32 -> 256 at its third epoch, stopped at its
        seventh, and took 4.2 s against 3.2 s (medians of 3 seeds)."""
        left = self.params["epochs"] - epoch - 1
        for stopper in self.stoppers:
            patience = getattr(stopper, "patience", left)
            left = min(left, max(0, patience - getattr(stopper, "wait", 0)))
        return left

    def propose(self, epoch, logs):
        if self.stopped:
            return None
        steps = self.timings.steady()
        switch = self.timings.switch_seconds()
        if self.batch not in steps:
            first = self.first_timing(epoch) if self.batch == self.base else None
            if first is None:
                return None
            steps, switch = {self.base: first.step}, first.switch
        remaining = self._epochs_left(epoch) * self.samples
        growth = goodput.grow(
            self.batch,
            self.base,
            self.scale.value,
            steps,
            ceiling=self.ceiling,
            remaining_samples=remaining,
            switch_seconds=switch,
            compute_seconds=self.compute_seconds,
            doublings=self._doublings(),
        )
        self.growths.append((epoch, growth))
        if growth.batch == self.batch:
            return None
        # Validation stays at the batch the run began with: its metrics are
        # the same figures (EarlyStopping compares like with like), and its
        # compiled step is reused.
        return {"batch_size": growth.batch, "validation_batch_size": self.validation}

    def _doublings(self) -> int:
        rule = self._rule or goodput.rule_of(self.model.optimizer)
        return MAX_DOUBLINGS if rule is not None and rule.scaling == "sqrt" else 1

    def changed(self, arguments):
        new = arguments["batch_size"]
        factor = self._rule.factor(new, self.base)
        rate = keras_compat.learning_rate_object(core_optimizer(self.model.optimizer))
        rate.assign(rate.numpy() * factor / self.factor)
        if self.say is not None:
            growth = self.growths[-1][1]
            self.say(
                said(
                    f"kerascale: batch {self.batch} -> {new} from the next epoch "
                    f"(noise scale {growth.noise:.0f}, goodput x{growth.gain:.2f}); "
                    f"learning rate x{factor:.3g} of yours ({self._rule.why})"
                )
            )
        at_one = self.pace.timed_at_one() if self.pace is not None else None
        if at_one is not None and self.pace.proposed:
            # The steps lever moves with this change: its check of the new
            # value compares with a step at one a call at this batch.
            step = at_one.training_step
            steps = {self.batch: step}
            more = goodput.predicted_step(steps, new, self.base, self.compute_seconds)
            self.pace.rebased(more - step)
        self._before = self.batch
        self.batch, self.factor = new, factor

    def undone(self, arguments, error):
        new, old = arguments["batch_size"], self._before
        rate = keras_compat.learning_rate_object(core_optimizer(self.model.optimizer))
        factor = self._rule.factor(old, self.base)
        rate.assign(rate.numpy() * factor / self.factor)
        self.batch, self.factor, self.stopped = old, factor, True
        return (
            f"Not applied: batch {new}, because its first step failed "
            f"({type(error).__name__}: {str(error)[:200]}): the run goes on at "
            f"batch {old}, which trained, and the batch stays. To choose the "
            "batch yourself, pass batch_size=."
        )

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the lever: the batch the run is at and
        the factor its learning rate is at (the rate itself is the
        optimizer's state, restored with it), and what it measured, so a
        resumed run goes on from them (`resumed`)."""
        return {
            "base": self.base,
            "batch": self.batch,
            "validation": self.validation,
            "factor": self.factor,
            "stopped": self.stopped,
            "taken": self.taken,
            "measure_seconds": self.measure_seconds,
            "compute_seconds": self.compute_seconds,
            "noise": self.scale.state(),
            "started": self.timings.started,
            "epochs": {
                str(b): [list(e) for e in es] for b, es in self.timings.epochs.items()
            },
        }

    def resumed(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Goes on from a checkpoint's `state()`; returns the `fit` arguments
        the resumed run starts with (its batch), or none where `state` is of
        another base batch (the checkpoint's plan is pinned, so it is not,
        unless you passed another) and the run starts over from its own."""
        if int(state.get("base", -1)) != self.base:
            return {}
        self.batch = self._before = int(state["batch"])
        self.validation = int(state["validation"])
        self.factor = float(state["factor"])
        self.stopped = self.stopped or bool(state["stopped"])
        self.taken = int(state["taken"])
        self.measure_seconds = float(state["measure_seconds"])
        self.compute_seconds = state["compute_seconds"]
        self.scale.restore(state["noise"])
        self.timings.started = float(state.get("started", 0.0))
        self.timings.epochs = {
            int(b): [(float(s), int(n)) for s, n in es]
            for b, es in state["epochs"].items()
        }
        if self.batch == self.base:
            return {}
        return {"batch_size": self.batch, "validation_batch_size": self.validation}

    def finish(self):
        if self.factor != 1.0:
            rate = keras_compat.learning_rate_object(
                core_optimizer(self.model.optimizer)
            )
            rate.assign(rate.numpy() / self.factor)
            self.factor = 1.0


class EpochTimes:
    """The epochs' wall times, per batch. A batch's first epoch compiles
    its steps (training's, the shorter last batch's, on TensorFlow and
    JAX alike), so its steady time is its later epochs' (the fastest: a
    busy machine only slows one), and what its first epoch took beyond
    them is what moving to a new batch costs."""

    def __init__(self) -> None:
        # batch -> [(seconds, steps)] of each epoch at it
        self.epochs: dict[int, list[tuple[float, int]]] = {}
        # The longest first epoch of a batch whose epochs `moved` dropped.
        self.started = 0.0

    def moved(self, batch: int) -> None:
        """The steps per call moved: `batch`'s epochs before are another
        step's time, and are dropped; the first of them (the run's start, its
        compile) still tells what a new batch costs (`switch_seconds`). It
        was dropped with them, and a measurement then counted a switch as
        free: on issue 78's notebook it ran at every run's second epoch on
        JAX (0.1 to 0.6 s of a 1 to 3 s run) and bought nothing."""
        epochs = self.epochs.pop(batch, [])
        if epochs:
            self.started = max(self.started, epochs[0][0])

    def add(self, batch: int, seconds: float, steps: int) -> None:
        if steps >= TIMED_STEPS:
            self.epochs.setdefault(batch, []).append((seconds, steps))

    def seconds(self) -> float:
        """The time of every epoch timed."""
        return sum(s for epochs in self.epochs.values() for s, _ in epochs)

    def settled(self, batch: int) -> bool:
        """Whether `batch` is timed past its first epoch."""
        return len(self.epochs.get(batch, ())) >= 2

    def steady(self) -> dict[int, float]:
        """Seconds a step, its share of the epoch's validation in, per
        batch settled."""
        return {
            batch: min(s / n for s, n in epochs[1:])
            for batch, epochs in self.epochs.items()
            if len(epochs) > 1
        }

    def switch_seconds(self) -> float:
        """What a new batch costs the run: the most any batch's first epoch
        took beyond its fastest later one (the base's holds the run's own
        start too: an estimate on the safe side)."""
        costs = [0.0]
        for epochs in self.epochs.values():
            if len(epochs) > 1:
                costs.append(epochs[0][0] - min(s for s, _ in epochs[1:]))
        later = [s for epochs in self.epochs.values() for s, _ in epochs]
        if self.started and later:
            costs.append(self.started - min(later))
        return max(costs)
