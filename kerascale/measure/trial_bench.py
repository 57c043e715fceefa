"""The trials' bench: candidates prepared once (copies of the model on the
real data, in one session that puts everything back at its exit), timed in
interleaved rounds, within a budget. The decisions are `kerascale.measure.trials`'s.
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
from typing import Any

import keras

from kerascale import _tf_compat as tfc
from kerascale._display import said
from kerascale.apply import model as model_lib
from kerascale.apply import steps_in_run
from kerascale.apply.model import CannotRecreate
from kerascale.apply.session import Session, prepare
from kerascale.measure import budget
from kerascale.measure.probe import StepClock
from kerascale.measure.request import Given
from kerascale.measure.trial_result import ROUNDS, Trial
from kerascale.plan import reasons as reasons_lib
from kerascale.plan import steps as steps_rules
from kerascale.sense import backend as backend_lib
from kerascale.sense import memory
from kerascale.sense.model_facts import gist

# A timed window (benchmarks/trial_noise.py, 2 cores, the reference CNN's
# float32 against bf16 in 3 interleaved rounds, 3 times): 0.6 s windows (one
# 4096-image epoch, timed whole) gave mean gains of +49%, +43%, +53%, the
# per-round gains spreading by 8.8% (half-range, median); 1.5 s windows
# +16%, +8%, +94% (35%), as an epoch's pipeline start-up varies 2x.
WINDOW_SECONDS = 0.6
MIN_WINDOW_STEPS = 4
# A candidate's first fit, untimed: tracing, then tf.data's autotuning of a
# fresh pipeline (1 s trials after 2 steps put batch 64 at half its real
# speed on 2 cores). Later rounds start a new iterator: ROUND_WARMUP_STEPS.
WARMUP_STEPS = 2
WARMUP_SECONDS = 0.5
ROUND_WARMUP_STEPS = 2
WHOLE_EPOCH_SECONDS = 3.0  # shorter epochs are timed whole
PREPARE_GUESS_SECONDS = 1.5  # a candidate's preparation, before one is timed


class Bench:
    """Prepared candidates (copies of the model on the real data, in one
    session that puts everything back at its exit), the timing, the budget."""

    def __init__(self, given: Given, data, plan, verbose):
        self.given, self.data, self.plan = given, data, plan
        self.verbose = verbose
        self.session = Session()
        self.prepared: dict[tuple, Any] = {}
        self.trials: list[Trial] = []
        self.skipped: list[tuple[str, str]] = []
        self.spent = 0.0
        self.prepare_seconds: float | None = None
        self.samples: int | None = None
        self.unbudgeted = False
        self.speed: float | None = None  # samples/s, for the run's length
        self._first_speed = None

    def __enter__(self) -> Bench:
        self.session.__enter__()
        self.session.enter(model_lib.preserved_state())
        return self

    def __exit__(self, *exc) -> bool:
        # Candidates hold copies of the model and their datasets: collected
        # here, before training, where any were made (a full collection costs
        # 0.2 s with TensorFlow loaded, too much for a repeated short fit).
        made = bool(self.prepared)
        self.prepared.clear()
        try:
            return self.session.__exit__(*exc)
        finally:
            if made:
                memory.collect()

    def budget_for(self, samples, unbudgeted, speed, first_speed=None) -> None:
        """The run's samples (None: unknown), whether nothing is weighed,
        its speed where known, and what estimates one (an eager forward
        pass, `first_step.train_seconds_per_sample`) where a stage needs it."""
        self.samples, self.unbudgeted, self.speed = samples, unbudgeted, speed
        self._first_speed = first_speed

    def _too_few_steps(self, keys: list[tuple], field: str) -> str | None:
        """Why timing `keys` cannot repay itself whatever a step takes: the
        run trains fewer steps than the stage's timing would, scaled by the
        share it may save (no speed needed: a short run of a model that is
        slow to run eagerly is refused without running it)."""
        if self.unbudgeted or self.samples is None:
            return None
        run = self.samples / max(1, self.plan.micro_batch_size)
        least = ROUNDS * len(keys) * (ROUND_WARMUP_STEPS + MIN_WINDOW_STEPS)
        share = budget.gain(field, self.plan.backend)
        return budget.refused_in_steps(least, run, share, field)

    # The budget.
    def _cost(self, new: int, timed: int) -> float:
        """Seconds to prepare `new` candidates and time `timed` ones."""
        step = self.plan.micro_batch_size / self.speed if self.speed else 0.05
        window = (
            max(WINDOW_SECONDS, MIN_WINDOW_STEPS * step) + ROUND_WARMUP_STEPS * step
        )
        epoch = self.data.num_samples
        if epoch and whole_epochs(epoch, self.speed):
            window = max(WINDOW_SECONDS, epoch / self.speed)
        prep = self.prepare_seconds or PREPARE_GUESS_SECONDS
        return new * prep + ROUNDS * timed * window

    def value(self, keys: list[tuple], field: str) -> float:
        """Seconds the stage timing `keys` is expected to save, less its
        cost (`budget.Price.saving`); inf with no budget, -inf with no figures."""
        if self.unbudgeted:
            return math.inf
        self._estimate_speed()  # the stages are ordered by it
        if self.samples is None or not self.speed:
            return -math.inf
        return self._price(keys, field).saving

    def _estimate_speed(self) -> None:
        """The first estimate of the run's speed, where none is known yet."""
        if self.speed is None and self._first_speed is not None:
            self.speed, self._first_speed = self._first_speed(), None

    def _skip(self, keys: list[tuple], field: str) -> str | None:
        """Why the stage `field` timing `keys` cannot repay its cost, or None."""
        if self.unbudgeted:
            return None
        if self.samples is None:
            return (
                "the run's length is unknown (a dataset of unknown size); pass "
                "steps_per_epoch= to let kerascale weigh them"
            )
        if not self.speed:
            return "no first speed to weigh them against (the first candidate failed)"
        return budget.refused(self._price(keys, field))

    @property
    def run_seconds(self) -> float | None:
        """The run's seconds at the speed known now (the first estimate, then
        the fastest the trials timed), what `TrialResult.cost` says the
        trials took a share of; None where the run is not weighed. Where
        the run chooses its steps per call (the plan's "steps.default"),
        a step is counted as the run's move to up to a quarter of an epoch
        a call is expected to make it (`steps_in_run.expected_step`): issue
        81 saw 310s said of a run of 32s."""
        if self.unbudgeted or self.samples is None or not self.speed:
            return None
        seconds = self.samples / self.speed
        why = self.plan.reasons.get("steps_per_execution")
        if why is None or reasons_lib.code(why) != "steps.default":
            return seconds
        batch = self.plan.global_batch_size
        epoch = (self.data.num_samples or 0) // max(1, batch)
        t1 = batch / self.speed
        k = epoch // steps_rules.EPOCH_SHARE
        return seconds * steps_in_run.expected_step(t1, self.plan.backend, k) / t1

    def _price(self, keys: list[tuple], field: str) -> budget.Price:
        """What the stage `field` timing `keys` costs, against the run's
        seconds and the share it may save."""
        new = sum(k not in self.prepared for k in keys)
        cost = self._cost(new, len(keys))
        share = budget.gain(field, self.plan.backend)
        return budget.Price(field, cost, self.samples / self.speed, share)

    # Measuring.
    def compare(self, keys: list[tuple], field: str) -> list[Trial]:
        """Prepares the candidates `keys` and times them in interleaved
        rounds; [] when the stage is not afforded (recorded in `skipped`)."""
        why = self._too_few_steps(keys, field)
        if why is not None:
            self.skipped.append((field, why))
            return []
        self._estimate_speed()
        if self.speed is None and not self.unbudgeted and self.samples is not None:
            # No first estimate: the first candidate's warm-up gives one.
            self._prepare(keys[0])
        why = self._skip(keys, field)
        if why is not None:
            self.skipped.append((field, why))
            return []
        for k in keys:
            self._prepare(k)
        repeats: dict[tuple, list[float]] = {k: [] for k in keys}
        for _ in range(ROUNDS):
            for k in keys:
                if not isinstance(self.prepared[k], str):
                    repeats[k].append(self._timed(k))
        out = []
        for k in keys:
            out.append(dataclasses.replace(self._trial(k, repeats[k]), stage=field))
            if self.verbose != 0:
                print(said(f"kerascale: trial: {out[-1].describe()}"), flush=True)
        self.trials += out
        timed = [t.samples_per_s for t in out if t.samples_per_s > 0]
        if timed and not self.unbudgeted:  # the run's length, as measured
            self.speed = max(timed)
        return out

    def _trial(self, key: tuple, speeds: list[float]) -> Trial:
        entry = self.prepared[key]
        if isinstance(entry, str):  # why it could not train
            return Trial(*key, 0.0, failed=entry)
        mean = sum(speeds) / len(speeds) if speeds else 0.0
        spread = (max(speeds) - min(speeds)) / mean if len(speeds) > 1 and mean else 0.0
        return Trial(*key, mean, spread, tuple(speeds))

    def _prepare(self, key: tuple) -> None:
        if key in self.prepared:
            return
        start = time.perf_counter()
        try:
            batch, policy, optimize = key
            self.prepared[key] = Prepared(
                self.session,
                self.given,
                self.data,
                self.plan,
                batch=batch,
                policy=policy,
                optimize=optimize,
            )
        except CannotRecreate:
            raise  # the model cannot be copied at all: decide re-plans
        except Exception as e:  # the candidate cannot train: it is dropped
            self.prepared[key] = f"{type(e).__name__}: {gist(e)}"
        seconds = time.perf_counter() - start
        self.spent += seconds
        self.prepare_seconds = max(self.prepare_seconds or 0.0, seconds)
        entry = self.prepared[key]
        if self.speed is None and not isinstance(entry, str):
            self.speed = entry.warm_speed

    def _timed(self, key: tuple) -> float:
        start = time.perf_counter()
        try:
            return self.prepared[key].time(WINDOW_SECONDS)
        except CannotRecreate:
            raise
        except Exception as e:  # it trained once, then failed: dropped too
            self.prepared[key] = f"{type(e).__name__}: {gist(e)}"
            return 0.0
        finally:
            self.spent += time.perf_counter() - start


class Prepared:
    """One candidate: a copy of the model under its precision, on the real
    data at its batch and pipeline, prepared on `fit`'s own path inside the
    bench's session, then warmed up (untimed). On TensorFlow it reads a
    dataset (arrays become one); on JAX the data as Keras's JAX `fit` takes
    it (arrays in batches, shuffled as `fit` shuffles them)."""

    def __init__(self, session, given: Given, data, plan, *, batch, policy, optimize):
        view = dataclasses.replace(
            plan,
            precision=policy,
            micro_batch_size=batch,
            accumulation_steps=1,
            global_batch_size=batch * plan.replicas,
            lr_factor=1.0,
        )
        decided = types.SimpleNamespace(
            plan=view, data=data, instance=None, optimize_data=optimize
        )
        on_tf = backend_lib.traits(plan.backend).feeds_datasets
        prepared = prepare(
            session, given.model, given.x, given.y, decided, copy=True, as_dataset=on_tf
        )
        self.model, ds = prepared.model, prepared.x
        self.samples_per_step = batch * plan.replicas
        self.feed: tuple[tuple, dict] = ((ds,), {})
        self.shuffled = data.kind == "arrays" and not on_tf
        if self.shuffled:  # Keras batches and shuffles them
            feed = (ds, prepared.y), {"batch_size": prepared.fit_kwargs["batch_size"]}
            self.finite, steps = (
                True,
                math.ceil(data.num_samples / self.samples_per_step),
            )
            self.feed = feed
        else:
            if tfc.draws_seeds(ds):
                # Timed on a copy with shuffles of its own: iterating the user's
                # dataset would shift the order of their training's epochs.
                ds = tfc.unshared_dataset(ds)
            steps = int(ds.cardinality())
            self.finite = steps >= 0
            self.feed = ((ds if self.finite else ds.repeat(),), {})
        clock = self.fit_with(
            StepClock(WARMUP_STEPS, WARMUP_SECONDS, WINDOW_SECONDS / 2)
        )
        self.warm_speed = clock.speed(self.samples_per_step)
        # A short epoch is timed whole, with the start-up of its input
        # pipeline, as training runs it: a window that caught an epoch's
        # start only now and then measured 10x below its neighbours.
        self.epoch_samples = data.num_samples or max(0, steps) * self.samples_per_step
        self.whole = self.finite and whole_epochs(self.epoch_samples, self.warm_speed)

    def fit_with(self, clock: Any) -> Any:
        """Trains the candidate with `clock` as its one callback until the
        clock stops it; returns the clock."""
        args, kwargs = self.feed
        self.model.fit(
            *args,
            epochs=100_000 if self.finite else 1,
            steps_per_epoch=None if self.finite else 100_000,
            verbose=0,
            # Keras ignores it for a dataset (with a warning), and shuffles
            # arrays by default, as the user's training will.
            shuffle=self.shuffled,
            callbacks=[clock],
            **kwargs,
        )
        return clock

    def time(self, window: float) -> float:
        """samples/s over one window: whole epochs (at least `window`
        seconds) where an epoch is short, else steps within the first epoch
        after a new iterator's warm-up."""
        if self.whole:
            clock = self.fit_with(_EpochClock(window))
            return clock.speed(self.epoch_samples)
        clock = self.fit_with(
            StepClock(ROUND_WARMUP_STEPS, 0.0, window, MIN_WINDOW_STEPS)
        )
        return clock.speed(self.samples_per_step)


def whole_epochs(epoch_samples: int, speed: float | None) -> bool:
    """Whether epochs are short enough (WHOLE_EPOCH_SECONDS) to time whole."""
    return (
        bool(epoch_samples and speed) and epoch_samples / speed <= WHOLE_EPOCH_SECONDS
    )


class _EpochClock(keras.callbacks.Callback):
    """Times whole epochs from the fit's start, stopping at the first
    epoch's end `window` seconds or more after it."""

    def __init__(self, window: float):
        super().__init__()
        self.window = window
        self.start: float | None = None
        self.end: float | None = None
        self.epochs = 0

    def on_epoch_begin(self, epoch, logs=None):
        if self.start is None:
            self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.end = time.perf_counter()
        self.epochs += 1
        if self.end - self.start >= self.window:
            self.model.stop_training = True

    def speed(self, epoch_samples: int) -> float:
        seconds = (self.end or 0.0) - (self.start or 0.0)
        return self.epochs * epoch_samples / seconds if seconds > 0 else 0.0
