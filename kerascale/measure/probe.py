"""One batch-size probe: a real training step at a given batch, and whether it
fit (`ok`, `oom` or `error`), its peak memory and its speed; and the prober
that runs probes in this process (`kerascale.measure.child` runs them in child
processes; docs/batch-search.md says which runs where, and why)."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras

from kerascale import _keras_compat as keras_compat
from kerascale.apply import model as model_lib
from kerascale.apply.session import Session
from kerascale.measure.probe_data import decode_structure, synthetic_batch
from kerascale.measure.result import ERROR, OK, OOM, ProbeResult
from kerascale.plan.plan import Plan
from kerascale.sense import memory
from kerascale.sense.data_facts import as_structure
from kerascale.sense.model_facts import is_builder
from kerascale.sense.oom import is_oom_exception

if TYPE_CHECKING:
    from kerascale.measure.host_share import HostShare

logger = logging.getLogger("kerascale")

# Steps are timed for at least this long, so that throughput is comparable
# between a batch of 4 (sub-millisecond steps) and one of 4096.
MIN_TIMED_SECONDS = 0.3
MAX_TIMED_STEPS = 1000  # a bound on a probe's timed steps


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """Everything a probe needs besides the model and the batch; JSON-ready.

    Attributes:
        element: The per-sample structure of one element, encoded by
            `probe_data.encode_structure` (`(inputs, targets)` or `(inputs, targets,
            sample_weight)`, as the data yields).
        policy: The dtype policy name.
        strategy: The plan's strategy name.
        devices: The plan's devices.
        logical_cpus: Logical CPU devices to configure in a child (tests split
            one CPU in two to stand in for two GPUs).
        steps: Training steps per probe (the first is a warm-up).
        validate: Also run one validation step at the batch.
        accumulation_steps: Gradient accumulation on the optimizer.
        memory_limit: Bytes a probe may use (resident memory on CPU, per device
            on GPU); None for no limit of kerascale's own.
        on_gpu: Whether the plan trains on GPUs.
        timed_seconds: The least time the timed steps take (more steps are
            run when they are quicker), for a steady samples/s.
        recompute: The plan's recomputation mode ("" for none).
        host_share: On a CPU, what the process where `fit` trains holds
            beside a probe's step (`measure.host_share.HostShare.to_list`:
            its resident memory where the limit counts it, what Keras's fit
            builds from the input, fixed and per sample of a global batch):
            each probe's peak is the peak that process would reach.
        optimizer_built: Whether the model's optimizer has its state (slots)
            where `fit` trains. Keras's `load_model` builds it in the child
            (an Adam's 44 MiB for an MLP of 5.8M weights), before the child's
            baseline: where `fit` will build it, a probe counts it too.
    """

    element: Any
    policy: str = "float32"
    strategy: str = "default"
    devices: tuple[str, ...] = ("/cpu:0",)
    logical_cpus: int = 1
    steps: int = 3
    validate: bool = True
    accumulation_steps: int = 1
    memory_limit: int | None = None
    on_gpu: bool = False
    timed_seconds: float = MIN_TIMED_SECONDS
    recompute: str = ""
    host_share: tuple[Any, ...] = ()
    optimizer_built: bool = True

    def share(self) -> HostShare:
        from kerascale.measure.host_share import HostShare

        return HostShare.from_list(self.host_share) if self.host_share else HostShare()

    def global_batch(self, batch: int) -> int:
        return batch * max(1, len(self.devices))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProbeSpec:
        d = json.loads(text)
        d["devices"] = tuple(d["devices"])
        d["host_share"] = tuple(d.get("host_share", ()))
        return cls(**d)


# --- The probe itself (in a child, or in-process) -------------------------------


class _PeakSampler:
    """This process's peak resident memory over a block, sampled in a thread
    every 2 ms (resident memory falls again when TensorFlow frees a step's
    tensors); with `exact`, also Linux's own peak (VmHWM), reset at the start
    where the kernel allows it. Only a probe child resets it: the reset
    cannot be undone, and in the user's process it would lower the peak that
    `getrusage` and /proc report to them."""

    def __init__(self, interval: float = 0.002, *, exact: bool = False):
        self._read = memory.resident_bytes
        self._exact = exact and memory.reset_resident_peak()
        self.interval = interval
        self.peak = self._read() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            now = self._read() or 0
            self.peak = max(self.peak, now)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read() or 0)
        if self._exact:
            self.peak = max(self.peak, memory.resident_peak_bytes() or 0)


def _reset_cpu_stats() -> bool:
    """Resets the CPU allocator's peak; False where TensorFlow keeps none."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, RuntimeError, tf.errors.OpError):
        return False
    return True


def _gpu_names(spec: ProbeSpec) -> list[str]:
    return [d.strip("/").upper() for d in spec.devices if "gpu" in d.lower()]


def train_probe(
    model: Any,
    spec: ProbeSpec,
    batch: int,
    *,
    in_child: bool = False,
    arrays: Any = None,
) -> dict[str, Any]:
    """Trains `model` (already under the plan's policy and strategy) for
    `spec.steps` steps on a synthetic per-replica `batch`; returns
    {peak_bytes, samples_per_s}. Raises whatever training raises.

    With `arrays` (synthetic `(x, y)` arrays like the user's), it trains
    them through `fit(x, y, batch_size=...)`, Keras's own path for arrays;
    else one synthetic batch, repeated.

    On CPU the peak is the process's resident memory, the quantity
    `memory_limit` limits there: in a probe child (`in_child`), Linux's exact
    peak (VmHWM, reset before the probe); in this process, sampled.
    """
    import tensorflow as tf

    replicas = max(1, len(spec.devices))
    global_batch = batch * replicas
    if arrays is not None:
        inputs = dict(zip(("x", "y", "sample_weight"), arrays, strict=False))
        inputs["batch_size"] = global_batch
        # Epochs of as many steps as the arrays give; the clock stops them.
        per_epoch = max(1, len(keras.tree.flatten(arrays)[0]) // global_batch)
        epochs = -(-MAX_TIMED_STEPS // per_epoch)
    else:
        element = decode_structure(spec.element)
        data = as_structure(synthetic_batch(element, global_batch))
        inputs = {"x": tf.data.Dataset.from_tensors(data).repeat()}
        epochs = 1
    gpus = _gpu_names(spec) if spec.on_gpu else []
    for g in gpus:
        tf.config.experimental.reset_memory_stats(g)
    cpu_stats = not gpus and _reset_cpu_stats()
    timed_steps = max(1, spec.steps - 1)
    with _PeakSampler(exact=in_child) as sampler:
        if arrays is not None:
            clock = _fit_arrays(model, spec, inputs, epochs, timed_steps)
        else:
            fit = dict(inputs, verbose=0, shuffle=False)
            model.fit(**fit, epochs=1, steps_per_epoch=1)  # warm-up: tracing
            # At least `timed_steps` steps and `timed_seconds`, after one
            # more untimed step (a first step at a new shape can still be
            # slow): timed as whole `fit` calls, a call's own start put 256
            # at 0.55-0.75 of 128's and 512's speed on the reference CNN.
            clock = StepClock(1, 0.0, spec.timed_seconds, timed_steps)
            model.fit(**fit, steps_per_epoch=MAX_TIMED_STEPS, callbacks=[clock])
            if spec.validate:
                model.evaluate(**inputs, steps=1, verbose=0)
    if gpus:
        peak = max(tf.config.experimental.get_memory_info(g)["peak"] for g in gpus)
    else:
        peak = sampler.peak
    tensor_peak = None
    if cpu_stats:
        tensor_peak = int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    return {
        "peak_bytes": int(peak),
        "tensor_peak_bytes": tensor_peak,
        "samples_per_s": clock.speed(global_batch) or None,
    }


def _fit_arrays(
    model: Any, spec: ProbeSpec, inputs: dict[str, Any], epochs: int, timed: int
) -> StepClock:
    """Trains arrays as the user's `fit` does: in one `fit` call, shuffled,
    its first two steps untimed. Each `fit` of arrays makes its own copies of
    them, which the user's one `fit` makes once (a conv net's second `fit`
    in one process peaked 200 MB, its data's size, above its first);
    validation runs on a view of one batch, as `fit`'s own would run on
    arrays it already holds."""
    memory.release_freed()  # what an earlier probe left in cycles
    clock = StepClock(2, 0.0, spec.timed_seconds, timed)
    model.fit(**inputs, epochs=epochs, verbose=0, shuffle=True, callbacks=[clock])
    if spec.validate:
        batch = inputs["batch_size"]
        cut = {k: v for k, v in inputs.items() if k != "batch_size"}
        cut = keras.tree.map_structure(lambda a: a[:batch], cut)
        model.evaluate(**cut, batch_size=batch, steps=1, verbose=0)
    return clock


class StepClock(keras.callbacks.Callback):
    """Marks each call's end (a call runs `steps_per_execution` steps, the
    last of an epoch perhaps fewer); stops training `window` seconds (and at
    least `min_steps` calls) after a warm-up of `warm_steps` calls and
    `warm_seconds`. Steps are timed between call ends inside one `fit`, so
    that a `fit` call's own start (its iterator, its callbacks) is not
    counted as training."""

    def __init__(self, warm_steps, warm_seconds, window, min_steps=1):
        super().__init__()
        self.warm_steps, self.warm_seconds = warm_steps, warm_seconds
        self.window, self.min_steps = window, min_steps
        self.marks: list[float] = []
        self.steps: list[int] = []  # the steps run by each mark
        self.start: int | None = None
        self._first = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._first = batch

    def on_train_batch_end(self, batch, logs=None):
        marks = self.marks
        marks.append(time.perf_counter())
        ran = keras_compat.steps_of_call(self.params, self._first, batch)
        self.steps.append((self.steps[-1] if self.steps else 0) + ran)
        if self.start is None:
            warm = marks[-1] - marks[0] >= self.warm_seconds
            if len(marks) >= self.warm_steps and warm:
                self.start = len(marks) - 1
        elif (
            marks[-1] - marks[self.start] >= self.window
            and len(marks) - 1 - self.start >= self.min_steps
        ):
            self.model.stop_training = True

    def speed(self, samples_per_step: int) -> float:
        """Samples/s over the timed steps."""
        marks = self.marks
        first = self.start if self.start is not None else len(marks) - 1
        steps = self.steps[-1] - self.steps[first] if marks else 0
        seconds = marks[-1] - marks[first] if steps > 0 else 0.0
        return steps * samples_per_step / seconds if seconds > 0 else 0.0


def build_probe_model(
    session: Session,
    model: Any,
    spec: ProbeSpec,
    instance: Any = None,
    *,
    own_copy: bool = False,
) -> Any:
    """What `fit` would train, prepared on the one path inside `session`:
    `model` under the spec's policy and strategy (or the user's strategy
    `instance`), compiled, with the spec's gradient accumulation.

    With `own_copy` (a child's freshly loaded model), a model that needs no
    strategy scope trains as it is, its precision set in place, as `fit`
    would: a needless copy would double its weights in memory and make the
    probe pessimistic. Otherwise a copy trains (or the model itself,
    borrowed, when it cannot be copied and the plan keeps it as it is).
    """
    in_scope = spec.strategy == "default" and instance is None
    replicas = max(1, len(spec.devices))
    plan = Plan(  # what `model_for` and `accumulate` read; the batch is the probe's
        strategy=spec.strategy,
        devices=tuple(spec.devices),
        replicas=replicas,
        precision=spec.policy,
        micro_batch_size=1,
        accumulation_steps=spec.accumulation_steps,
        global_batch_size=replicas * spec.accumulation_steps,
        rebuild=not in_scope,
        recompute=spec.recompute,
        backend="tensorflow",  # the probes' children run TensorFlow
    )
    new, _ = session.model_for(
        model,
        plan,
        instance=instance,
        copy=is_builder(model) or not (own_copy and in_scope),
    )
    session.accumulate(new, plan, final=False)
    return new


class InProcessProber:
    """Runs probes on a clone in this process: one clone for each sweep's
    batches in turn, as a child process trains them."""

    def __init__(self, model: Any, spec: ProbeSpec, *, strategy: Any = None):
        self.model = model
        self.spec = spec
        self.strategy = strategy  # the user's own instance, if any

    def __enter__(self) -> InProcessProber:
        return self

    def __exit__(self, *exc) -> None:
        pass  # each sweep collects what its clone left (0.2-0.3 s a collection)

    def baseline_bytes(self) -> int | None:
        return None

    def __call__(self, batch: int) -> ProbeResult:
        return self.sweep([batch])[0]

    def sweep(
        self,
        batches: list[int],
        admit: Callable[[int, list[ProbeResult]], bool] = lambda b, done: True,
    ) -> list[ProbeResult]:
        """Probes `batches` in order while `admit(batch, results so far)`
        (none admitted: no clone is built, and no results); stops at the first
        that does not fit, which is probed again alone on a clone of its own
        (what the smaller batches left can tip a batch near the limit over)."""
        results: list[ProbeResult] = []
        if not admit(batches[0], results):
            return results
        start = time.perf_counter()
        try:
            with Session() as session:
                session.enter(model_lib.preserved_state())
                clone = build_probe_model(session, self.model, self.spec, self.strategy)
                for batch in batches:
                    if not admit(batch, results):
                        break
                    results.append(self._trained(clone, batch, start))
                    start = time.perf_counter()
                    if results[-1].outcome != OK:
                        break
                del clone
        except model_lib.CannotRecreate:
            raise  # no copy can be made: the caller plans without one
        except Exception as e:  # the clone could not be built (or put away):
            # as a child reports it, against the batch it stopped at
            if len(results) == len(batches):
                results.pop()
            results.append(_failed(batches[len(results)], e, start))
        finally:
            memory.collect()
        if len(results) > 1 and results[-1].outcome != OK:
            alone = self.sweep([results[-1].batch])[0]
            results[-1] = dataclasses.replace(
                alone, seconds=alone.seconds + results[-1].seconds
            )
        return results

    def _trained(self, clone: Any, batch: int, start: float) -> ProbeResult:
        try:
            r = train_probe(clone, self.spec, batch)
        except Exception as e:  # as a child reports it: the search decides
            return _failed(batch, e, start)
        # This process holds the data already; what fit builds from it is not
        # in a probe's one-batch pipeline.
        extra = self.spec.share().held_bytes(self.spec.global_batch(batch))
        r["peak_bytes"] += extra
        if r["tensor_peak_bytes"] is not None:
            r["tensor_peak_bytes"] += extra
        limit = self.spec.memory_limit
        if limit and r["peak_bytes"] > limit:
            # On CPU in-process nothing enforces the limit: honour it by measure.
            return ProbeResult(
                batch,
                OOM,
                peak_bytes=r["peak_bytes"],
                seconds=time.perf_counter() - start,
                samples_per_s=r["samples_per_s"],
                message="peak memory above memory_limit (measured in-process)",
            )
        return ProbeResult(
            batch,
            OK,
            tensor_peak_bytes=r["tensor_peak_bytes"],
            peak_bytes=r["peak_bytes"],
            seconds=time.perf_counter() - start,
            samples_per_s=r["samples_per_s"],
        )


def _failed(batch: int, e: Exception, start: float) -> ProbeResult:
    """A probe that raised, as a child reports it. On GPU, memory running out
    is an error raised here (the allocator refuses), after which the process
    goes on: the exception is dropped, and the clone's tensors with it."""
    oom = is_oom_exception(e)
    return ProbeResult(
        batch,
        OOM if oom else ERROR,
        seconds=time.perf_counter() - start,
        message=f"{type(e).__name__}: {str(e)[: 500 if oom else 2000]}",
    )
