"""Why each field of a plan has its value: a code with its details, worded
here, in one place (`WORDS`).

The code is what code and tests read (`plan.reasons["precision"].code`); the
words may change without breaking either. A `Reason` is also a `str`, its
words, so it prints, joins and serialises as the plan has always said it.
A plan read back from JSON (a checkpoint's) has the words only: `code()`
reads "" there.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

from kerascale._units import format_bytes


class Reason(str):
    """A plan's reason: `code` (which rule or measurement decided),
    `details` (its figures), and, as a `str`, its words.

    Args:
        code: A key of `WORDS`.
        **details: The figures its words are made from.
    """

    code: str
    details: Mapping[str, Any]

    def __new__(cls, code: str, /, **details: Any) -> Reason:
        words = WORDS[code]
        text = words(**details) if callable(words) else words.format(**details)
        return _made(code, details, text)

    def noted(self, note: str) -> Reason:
        """The same decision, with `note` after it in parentheses (what a
        measurement that was skipped would have decided)."""
        return _made(self.code, {**self.details, "note": note}, f"{self} ({note})")

    def after(self, first: str) -> Reason:
        """The same decision, `first` said before it."""
        return _made(self.code, {**self.details, "first": first}, f"{first}; {self}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_made, (self.code, dict(self.details), str(self)))

    def __repr__(self) -> str:
        return f"Reason({self.code!r}: {str.__repr__(self)})"


def _made(code: str, details: Mapping[str, Any], text: str) -> Reason:
    reason = str.__new__(Reason, text)
    reason.code = code
    reason.details = types.MappingProxyType(dict(details))
    return reason


def code(reason: str) -> str:
    """`reason`'s code, or "" for words alone (a plan read back from JSON)."""
    return getattr(reason, "code", "")


def noted(reason: str, note: str) -> str:
    """`reason` with `note` after it; `note` alone where there is none."""
    if not reason:
        return note
    if isinstance(reason, Reason):
        return reason.noted(note)
    return f"{reason} ({note})"


def after(reason: str, first: str) -> str:
    """`reason` with `first` said before it; `first` alone where there is
    none."""
    if not reason:
        return first
    if isinstance(reason, Reason):
        return reason.after(first)
    return f"{first}; {reason}"


def _s(n: int) -> str:
    return "s" if n != 1 else ""


def _gpu_capability(spelled: str, lowest: bool, then: str) -> str:
    across = " (lowest across GPUs)" if lowest else ""
    return f"GPU compute capability {spelled}{across}{then}"


def _multi_worker(
    source: str, workers: int, devices: int, where: str, asked: bool
) -> str:
    return (
        f"{source}: {workers} workers x {devices} device{_s(devices)}"
        + (f", this is {where}" if where else "")
        + ("; you asked for it" if asked else "")
    )


def _sharded(devices: int, processes: int, batch: int, model: int, why: str) -> str:
    return (
        f"{devices} devices"
        + (f" of {processes} processes" if processes > 1 else "")
        + f" as a {batch} x {model} mesh: {why}"
    )


def _split_inexact(per_replica: int, bound: int, least: int, k: int, micro: int) -> str:
    return (
        f"{per_replica} per replica does not fit (at most {bound}) and has no "
        f"split into equal micro-batches of at least {least}: {k} x {micro} = "
        f"{micro * k} per replica instead"
    )


def _trials(
    field: str,
    cached: bool,
    rounds: int,
    figures: str,
    gain: float,
    attempts: int,
    max_attempts: int,
    uncertain: bool,
    optimized: bool,
) -> str:
    beyond = (
        f"in every round, by more than {gain:.0%} and half the range of the "
        "per-round gains"
    )
    if field == "batch":
        rule = (
            "the probes' fastest (smallest within 3%) unless another batch beats "
            f"it {beyond}; a batch that does is timed against the next rung the "
            "same way, while it wins"
        )
    else:
        rule = f"the alternative to what model.fit does only when it wins {beyond}"
    doubt = ""
    if uncertain:
        doubt = (
            f"; within noise: measured again on a later run ({attempts} of "
            f"{max_attempts})"
            if attempts < max_attempts
            else f"; within noise in {max_attempts} runs: a tie"
        )
    source = "cached trials" if cached else "trials"
    body = (
        f"measured on your data ({source}, {rounds} interleaved rounds, samples/s "
        f"± half their range: {figures}; {rule}){doubt}"
    )
    if field == "data_changes":
        return f"{'optimised' if optimized else 'left as given'}: {body}"
    return body


_JAX_DEFAULT = "Keras's JAX default (no keras.distribution)"
_DATA_PARALLEL = "keras.distribution.DataParallel, the batch split across them"
_TF_DEFAULT = "TensorFlow's default strategy"

# Code -> its words: a format string of the details, or a function of them.
WORDS: dict[str, str | Callable[..., str]] = {
    # strategy
    "strategy.asked": "you asked for it",
    "strategy.instance": "the strategy instance you passed",
    "strategy.tpu_asked": "you asked for it; 8 cores assumed",
    "strategy.tpu_found": "TPU found ({source}); 8 cores assumed",
    "strategy.gpus": lambda n, mixed: (
        f"{n} GPUs of {'mixed types' if mixed else 'one type'}"
    ),
    "strategy.one_gpu": f"one GPU: {_TF_DEFAULT}",
    "strategy.cpu_only": f"CPU only: {_TF_DEFAULT}",
    "strategy.multi_worker": _multi_worker,
    "strategy.jax_default_asked": f"you asked for it: {_JAX_DEFAULT}",
    "strategy.jax_one_device": f"one device: {_JAX_DEFAULT}",
    "strategy.shared_cpu_devices": (
        "{devices} CPU devices share {cores} cores: one trains as fast (split over "
        "them a batch computes no faster and adds an all-reduce; Keras's JAX "
        "default, no keras.distribution; strategy='data_parallel' splits anyway)"
    ),
    "strategy.data_parallel_asked": f"you asked for it: {_DATA_PARALLEL}",
    "strategy.data_parallel": "{devices} {kind} devices: " + _DATA_PARALLEL,
    "strategy.processes": lambda processes, devices, kind, index: (
        f"{processes} JAX processes (jax.distributed) x {devices} {kind} "
        f"device{_s(devices)}, this is process {index}: "
        "keras.distribution.DataParallel over all of them, each process reading "
        "its share of every global batch"
    ),
    "strategy.distribution_set": (
        "the keras.distribution set before fit (set_distribution)"
    ),
    "strategy.distribution_passed": "the keras.distribution you passed",
    "strategy.sharded": _sharded,
    "strategy.kept_default": "kept the default strategy: {why}",
    "strategy.kept_one_device": "kept one device: {why}",
    # precision
    "precision.asked": "you asked for it",
    "precision.model": "your model already uses {policy}",
    "precision.tpu": "TPU: bfloat16 is native on TPUs",
    "precision.gpu_unknown": "GPU compute capability unknown: float32 is safe",
    "precision.gpu_bf16": lambda spelled, lowest: _gpu_capability(
        spelled, lowest, " >= 8.0: bf16 tensor cores, and no loss scaling needed"
    ),
    "precision.gpu_fp16": lambda spelled, lowest: _gpu_capability(
        spelled, lowest, ": float16 tensor cores, with dynamic loss scaling"
    ),
    "precision.gpu_old": lambda spelled, lowest: _gpu_capability(
        spelled, lowest, " < 7.0: no tensor cores"
    ),
    "precision.cpu_by_trial": (
        "{why}: float32, unless the trials time your model faster in "
        "mixed_bfloat16; pass precision='mixed_bfloat16' to use it anyway"
    ),
    "precision.cpu_bf16": (
        "CPU has native bf16 ({flags}): bf16 math steps faster than float32"
    ),
    "precision.cpu_no_bf16": "CPU without native bf16: mixed precision would be slower",
    # rebuild
    "rebuild.builder": "built by your function under the plan's policy and scope",
    "rebuild.scope": lambda strategy, old, new: (
        f"variables must live in the {strategy} scope: copied as its own class, "
        "weights and compile settings kept"
        + (f"; dtype policy {old} -> {new} set in place" if old != new else "")
    ),
    "rebuild.policy_in_place": (
        "dtype policy {old} -> {new} set in place (put back when fit ends)"
    ),
    "rebuild.matches": "already matches the plan: zero overhead",
    # global_batch_size
    "batch.passed_as_is": "batch_size you passed, given to Keras as is",
    "batch.unknown": (
        "your data makes its own batches, of a size kerascale does not read (0 "
        "stands for unknown)"
    ),
    "batch.passed": "batch_size you passed",
    "batch.chosen_by": "batch_size {who} chose",
    "batch.dataset": "the batch size of your batched dataset",
    "batch.searched": "searched ({how}): {answer}",
    "batch.updates": lambda before, after, keras, scaled: (
        f"batch_size={keras} keeps Keras's; "
        + (
            "the learning rate is scaled to it, as you asked (lr_scaling)"
            if scaled
            else "the learning rate is unchanged: lr_scaling='linear' (or 'sqrt') "
            f"with base_batch_size={keras} scales it"
        )
        + f" (model.fit's batch of {keras} makes {before} an epoch, this one {after})"
    ),
    "batch.keras_default": (
        "data not batched and no batch_size given: Keras's default {default} per "
        "replica"
    ),
    "batch.capped": "{why}, capped at the data's {samples} samples",
    # batch_growth (a run on arrays at a batch kerascale chose, on a CPU)
    "growth.in_run": (
        "grows in the run where goodput rises (noise scale and step time "
        "measured at each epoch's end, at most x2 an epoch for SGD, x8 for the "
        "square root); learning rate {scaling} ({family})"
    ),
    "growth.kept": "the batch stays: {why}",
    # accumulation_steps
    "accumulation.fits": "the batch fits in one forward pass",
    "accumulation.no_bound": "no memory bound known: one forward pass per update",
    "accumulation.split": (
        "{per_replica} per replica does not fit (at most {bound}): {k} "
        "micro-batches of {micro}, gradients averaged"
    ),
    "accumulation.inexact": _split_inexact,
    "accumulation.passed": lambda k: (
        f"accumulation_steps={k} you passed" if k > 1 else "accumulation_steps=1"
    ),
    "accumulation.not_split": "not split",
    # lr_factor
    "lr.scaled": (
        "lr_scaling={scaling!r}: {rule} = {effective}/{base} ({where}) -> x{factor:g}"
    ),
    # data_changes
    "data.arrays": "arrays are batched and prefetched by Keras itself",
    "data.pydataset": "a PyDataset makes its own batches; Keras reads it",
    "data.other": "your data goes to Keras as it is (kerascale does not read it)",
    "data.pipeline": "{what} (optimize_data={optimize_data!r})",
    "data.read_ahead": (
        "Keras's JAX fit reads each batch in the training thread, and dispatches "
        "steps ahead, so reading overlaps the step; a callback with "
        "on_train_batch_end (yours, a FaultTolerantBackup, a TimeBudget) makes it "
        "wait for each step, and then the reading follows it: kerascale then "
        "reads 2 batches ahead on a thread (the same batches, in the same order). "
        "optimize_data={optimize_data!r}"
    ),
    # recompute
    "recompute.asked": (
        "recompute=True you passed: Keras's remat (activations mode) on every layer"
    ),
    "recompute.off": "recompute=False you passed",
    "recompute.not_weighed": (
        "not weighed: {why}; pass recompute=True to use it anyway"
    ),
    "recompute.weigh_failed": (
        "recomputation was not weighed: its search failed ({error}); pass "
        "recompute=True to use it anyway, or False to skip the attempt"
    ),
    "recompute.used": "{mode}: {figures}, and it trains faster ({measured})",
    "recompute.not_used": "not used: {figures}{why}",
    "recompute.chief": ("the chief's ({mode}), so that all workers compute alike"),
    # steps_per_execution
    "steps.asked": "steps_per_execution={n} you passed",
    "steps.compiled": "yours: the model was compiled with steps_per_execution={n}",
    "steps.default": "Keras's default ({why}); pass steps_per_execution= to set it",
    "steps.measured": (
        "the host path was {share:.0%} of a step ({t1:.2f} ms a step at 1, "
        "{tk:.2f} ms at {k}); {n} a call: {limit}"
    ),
    "steps.in_run": (
        "chosen in the run: one a call for its first epoch, timed, then up to "
        "{cap} ({why}) where the rest of the run repays the move"
    ),
    "steps.run_measured": (
        "measured in the run: the host path was {share:.0%} of a step "
        "({t1:.2f} ms a step at 1, {tk:.2f} ms at {k}); {n} a call: {limit}"
    ),
    "steps.run_back": (
        "measured in the run: a step took {tk:.2f} ms at {k} a call, "
        "{t1:.2f} ms at 1; back to one a call"
    ),
    "steps.run_not_worth": (
        "one a call: a step took {t1:.2f} ms in the run's first epoch, and the "
        "host path (about {host:.2f} ms a call) is too small a share of it"
    ),
    "steps.run_unpaid": (
        "one a call: {k} a call would save about {saved:.2f}s of the run left, "
        "under twice what moving costs ({cost:.2f}s: a new trace, a new fit)"
    ),
    "steps.run_moved": (
        "{n} a call after the first epoch ({t1:.2f} ms a step at 1 in the "
        "run; {limit}); the run ended before it was checked"
    ),
    "steps.run_short": ("one a call: the run ended before its first epoch was weighed"),
    "steps.not_worth": (
        "the host path was {share:.0%} of a step ({t1:.2f} ms a step at 1, "
        "{tk:.2f} ms at {k}): too little to gain"
    ),
    "steps.held": (
        "{who} overrides {hook}, which Keras calls once per call, not per step; "
        "pass steps_per_execution= to raise it anyway"
    ),
    "steps.profile": (
        "profile={window} traces the steps it names, counting calls; pass "
        "steps_per_execution= to raise it anyway"
    ),
    "steps.reshuffle": (
        "one: a checkpoint of a tf.data pipeline that reshuffles each epoch "
        "resumes exactly only at one on TensorFlow (an open finding, "
        "docs/conformance.md); pass steps_per_execution= to raise it anyway"
    ),
    "steps.replicas": (
        "one: Keras's TensorFlow fit fails at more under {strategy} with "
        "{replicas} replicas (keras-team/keras#19246)"
    ),
    # precision, measured
    "precision.failed_in_probe": (
        "{policy}: {tried} failed in the batch search's probe ({error}); pass "
        "precision='{policy}' to skip the attempt"
    ),
    "precision.chief": "the chief's ({policy}), so that all workers compute alike",
    # the CPU trials: the batch, the pipeline or the precision, timed
    "trials.measured": _trials,
    "trials.float32_over": lambda batch, policy, need, limit: (
        f"float32 was not timed against {policy}: at batch {batch}, searched "
        f"under {policy}, float32's activations (twice as wide) "
        + (
            f"need about {format_bytes(need)}, over the limit of {format_bytes(limit)}"
            if need is not None
            else f"would be over the limit of {format_bytes(limit)}"
        )
        + "; pass precision='float32' (and a batch it fits) to train it"
    ),
    # sharding
    "sharding.chosen": "{why}",
    "sharding.split": (
        "one replica needs {one} per device (XLA's count at one sample per "
        "replica), over {source} less the margin ({usable}): {variables} "
        "variables split over a model axis of {axis} ({whose}), {need} per "
        "device; {mesh} (tried {tried})"
    ),
    "mesh.only_fit": "the only mesh that fits: {mesh}",
    "mesh.untimed": "the smallest model axis that fits ({why})",
    "mesh.fastest": lambda mesh, tie, rate: (
        f"{mesh} trains fastest of the meshes that fit"
        + (f" (within {tie:.0%} of the fastest: the smaller model axis)" if tie else "")
        + f", by a real step: {rate:,.0f} samples/s"
    ),
    "sharding.fits": (
        "one replica needs {need} per device (a step of one sample per replica, "
        "by XLA's count), within {source} {limit} less the {margin:.0%} margin: "
        "not sharded"
    ),
    # the batch search's result (`BatchSearchResult.reasons`)
    "search.largest": lambda bound, margin: (
        f"largest that fits: {bound}"
        + (f", less the {margin:.0%} margin" if margin else "")
    ),
    "search.fastest": "{why}; memory: {bound}",
    "search.untimed": "no throughput measured: the memory bound",
    "search.none_timed": "the smallest of the batches (none was timed)",
    "search.fastest_timed": "the fastest the probes timed ({speed:.0f} samples/s)",
    "search.within_tolerance": (
        "within {tolerance:.0%} of the fastest, {fastest}, and smaller ({speed:.0f} "
        "vs {top:.0f} samples/s)"
    ),
    "search.margin": "{margin:.0%} of {fits} kept free for safety: {best}",
    "search.smallest_worker": (
        "{why}; the smallest of the {workers} workers' ({batches} per replica)"
    ),
    "search.one_pass": "it fits in one pass: no split, so no accumulators held",
    "search.with_recompute": (
        "with recomputation (fit's recompute=True) {bound} per replica fit, "
        "{ratio:.2f}x the {without} without"
    ),
    "search.probes": "{probes} probes, {seconds:.0f}s, {measured}",
    "search.memory": lambda measured, share, threshold_fixed: (
        measured
        + (f", counting {share}" if share else "")
        + (
            "; glibc's mmap threshold fixed at 128 KiB here and in the probes"
            if threshold_fixed
            else ""
        )
    ),
    "search.xla": "XLA's memory analysis, {compiles} compiles",
    "search.answered_here": (
        "{batch} per replica fits: find_batch_size answered {answer} in this "
        "process, for this model and data, precision and limit, and the "
        "process has not grown since (not measured again; it found: {searched})"
    ),
    "search.compiled": lambda fits, fails, cap, margin, counted, confirmed: (
        f"the largest per-replica batch whose compiled train step fits: {fits} fits"
        + (f"; {fails} does not" if fails is not None else f"; capped at {cap}")
        + (f", less the {margin:.0%} margin" if margin else "")
        + f" ({counted}){confirmed}"
    ),
    # where the probes ran
    "isolate.asked": "isolate={isolate}",
    "isolate.your_instance": "your strategy instance lives in this process",
    "isolate.tpu": "a TPU serves one process at a time",
    "isolate.gpu": (
        "in this process: on a GPU, this process's allocator holds the memory "
        "training will use, and running out of it is an error the process survives"
    ),
    "isolate.children": "each probe in a child process",
    "isolate.cannot_ship": "in this process: the model cannot be shipped ({problem})",
    "isolate.far_below": (
        "in this process: each step far below the memory limit, where a child "
        "process would cost a TensorFlow start"
    ),
    "isolate.here_then_children": (
        "in this process up to batch {batch}, in child processes beyond (a step "
        "nearer the memory limit)"
    ),
    # the largest batch searched
    "cap.ceiling": "kerascale's ceiling of {cap}",
    "cap.max_batch_size": "max_batch_size",
    "cap.dataset": "the dataset size",
    "cap.steps": "1/{steps} of the dataset, so that an epoch keeps {steps} updates",
    # the memory the probes had
    "limit.passed": "memory_limit you passed",
    "limit.passed_per_gpu": "memory_limit you passed (per GPU)",
    "limit.tpu_unknown": "TPU memory unknown: found by probing",
    "limit.unknown": "available memory unknown: found by probing alone",
    "limit.cpu_share": (
        "{share:.0%} of the memory available now ({available}), so that probing "
        "cannot exhaust the machine"
    ),
    "limit.gpu_unknown": "GPU memory unknown (no NVML): found by probing alone",
    "limit.gpu_child": lambda size, index, free, total, held: (
        f"about {size}: GPU:{index}'s {free} free now (of {total}) less "
        "TensorFlow's reserve, what a child process's allocator gets"
        + (
            ". Most of the GPU is held, by this process if TensorFlow already used "
            'it here: isolate="auto" probes in this process'
            if held
            else ""
        )
    ),
    "limit.gpu_here": lambda size, index, total, others, in_use: (
        f"about {size}: GPU:{index}'s {total}"
        + (f", less {others} other processes hold" if others else "")
        + f", less TensorFlow's reserve; this process's tensors hold {in_use} of "
        "it (a prediction: running out of memory in TensorFlow's allocator decides)"
    ),
    # the memory a JAX step may take on one device
    "limit.device_memory": (
        "device_memory you passed ({memory} per device) less the {state} of state on it"
    ),
    "limit.device_free": lambda passed, limit, used: (
        ("memory_limit you passed (per device)" if passed else "XLA's allocator limit")
        + f" {limit} less {used} in use"
    ),
    "limit.cpu_available": "{share:.0%} of the memory available ({limit})",
    "limit.passed_less_resident": (
        "memory_limit you passed ({limit}) less this process's {resident} resident"
    ),
    "limit.less_accumulators": "{why}, less {held} for gradient accumulators",
    # any field
    "resumed": "as in the checkpoint being resumed",
    "first_step_failed": lambda what, failure, skip: (
        f"{what} failed at the first training step ({failure}): training without "
        "them. Pass "
        + " and ".join(f"{k}={v!r}" for k, v in skip.items())
        + " to skip the attempt."
    ),
}
