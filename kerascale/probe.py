"""One batch-size probe: a real training step at a given batch, and whether it fit.

A probe trains the user's model (re-created under the plan's precision and
strategy, as `fit` would) on a synthetic batch shaped like the data, for a few
steps with the optimizer update, then runs one validation step at the same
batch. It reports the outcome (`ok`, `oom` or `error`), the peak memory and
the speed.

Two ways to run one:

- `IsolatedProber` (the default where the model can be shipped): each probe is
  a child process (`python -m kerascale.probe`) that loads the model from a
  `.keras` file in a private temp dir, under a real memory limit on CPU
  (`RLIMIT_DATA`) or a logical-device memory limit on GPU. A crash there never
  harms the caller, and TensorFlow gets all GPU memory back when it exits
  (it cannot otherwise: tensorflow#36465).
- `InProcessProber`: clones the model in this process and catches
  `ResourceExhaustedError`. It leaves the user's model, optimizer, random state
  and dtype policy as they were, but cannot survive a CPU out-of-memory abort,
  so on CPU it treats a peak above the limit as out of memory instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

logger = logging.getLogger("kerascale")

OK, OOM, ERROR = "ok", "oom", "error"

# Steps are timed for at least this long, so that throughput is comparable
# between a batch of 4 (sub-millisecond steps) and one of 4096.
MIN_TIMED_SECONDS = 0.3

# Text that only an allocation failure prints. TensorFlow: "OOM when allocating
# tensor", "ResourceExhaustedError"; the C++ runtime: "std::bad_alloc"; Python:
# "MemoryError"; glibc/mmap: "Cannot allocate memory".
_OOM_TEXT = (
    "resourceexhausted",
    "resource exhausted",
    "oom when allocating",
    "out of memory",
    "bad_alloc",
    "memoryerror",
    "cannot allocate memory",
    "failed to allocate",
    "unable to allocate",  # NumPy's MemoryError, also when Keras wraps it
)


def looks_like_oom(text: str) -> bool:
    low = text.lower()
    return any(t in low for t in _OOM_TEXT)


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What one probe found.

    Attributes:
        batch: The per-replica batch tried.
        outcome: "ok", "oom" (memory ran out) or "error" (anything else).
        peak_bytes: Peak memory: per device on GPU, the process's data memory
            on CPU; None when unknown (e.g. after a crash).
        seconds: Wall time of the probe, start-up included.
        samples_per_s: Training throughput across replicas, after warm-up.
        message: Why it failed, for "oom" and "error".
        tensor_peak_bytes: On CPU, the peak of TensorFlow's own allocator
            (tensors only): exact and linear in the batch, unlike the sampled
            process peak, so the memory model is fitted to it.
    """

    batch: int
    outcome: str
    peak_bytes: int | None = None
    seconds: float = 0.0
    samples_per_s: float | None = None
    message: str = ""
    tensor_peak_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- What a probe trains on ----------------------------------------------------


def encode_structure(structure: Any) -> Any:
    """A nest of `tf.TensorSpec` -> JSON (tuples, lists and dicts kept)."""
    import tensorflow as tf

    if isinstance(structure, tf.TensorSpec):
        return {
            "tensor": [None if d is None else int(d) for d in structure.shape],
            "dtype": structure.dtype.name,
        }
    if isinstance(structure, dict):
        return {"dict": {k: encode_structure(v) for k, v in structure.items()}}
    if isinstance(structure, tuple | list):
        kind = "tuple" if isinstance(structure, tuple) else "list"
        return {kind: [encode_structure(v) for v in structure]}
    raise TypeError(f"Cannot encode {type(structure).__name__} in a probe spec.")


def decode_structure(encoded: Any) -> Any:
    import tensorflow as tf

    if "tensor" in encoded:
        return tf.TensorSpec(encoded["tensor"], encoded["dtype"])
    if "dict" in encoded:
        return {k: decode_structure(v) for k, v in encoded["dict"].items()}
    if "tuple" in encoded:
        return tuple(decode_structure(v) for v in encoded["tuple"])
    return [decode_structure(v) for v in encoded["list"]]


def synthetic_batch(structure: Any, batch: int, seed: int = 0) -> Any:
    """A batch of `batch` elements shaped like the per-sample `structure`:
    floats drawn from N(0, 1), integers 0 (a valid class index), strings ""."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def make(spec):
        shape = (batch, *(1 if d is None else int(d) for d in spec.shape))
        dtype = spec.dtype
        if dtype.is_floating:
            return rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
        if dtype == tf.string:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=dtype.as_numpy_dtype)

    return tf.nest.map_structure(make, structure)


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """Everything a probe needs besides the model and the batch; JSON-ready.

    Attributes:
        element: The per-sample structure of one element, encoded by
            `encode_structure` (`(inputs, targets)` or `(inputs, targets,
            sample_weight)`, as the data yields).
        policy: The dtype policy name.
        strategy: The plan's strategy name.
        devices: The plan's devices.
        logical_cpus: Logical CPU devices to configure in a child (tests split
            one CPU in two to stand in for two GPUs).
        steps: Training steps per probe (the first is a warm-up).
        validate: Also run one validation step at the batch.
        accumulation_steps: Gradient accumulation on the optimizer.
        memory_limit: Bytes a probe may use (data memory on CPU, per device
            on GPU); None for no limit of kerascale's own.
        on_gpu: Whether the plan trains on GPUs.
        timed_seconds: The least time the timed steps take (more steps are
            run when they are quicker), for a steady samples/s.
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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProbeSpec:
        d = json.loads(text)
        d["devices"] = tuple(d["devices"])
        return cls(**d)


# --- The probe itself (in a child, or in-process) -------------------------------


class _PeakSampler:
    """Samples this process's data memory in a thread: Linux keeps no peak of
    VmData, and it falls again when TensorFlow frees a step's tensors."""

    def __init__(self, interval: float = 0.002):
        from kerascale import memory

        self._read = memory.data_bytes
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


def train_probe(model: Any, spec: ProbeSpec, batch: int) -> dict[str, Any]:
    """Trains `model` (already under the plan's policy and strategy) for
    `spec.steps` steps on a synthetic per-replica `batch`; returns
    {peak_bytes, samples_per_s}. Raises whatever training raises.

    On CPU the peak is sampled every 2 ms (Linux keeps no high-water mark of
    data memory alone), so a short spike can be missed: the search treats the
    memory model as a guide and confirms by probing.
    """
    import tensorflow as tf

    replicas = max(1, len(spec.devices))
    global_batch = batch * replicas
    element = decode_structure(spec.element)
    data = synthetic_batch(element, global_batch)
    ds = tf.data.Dataset.from_tensors(data).repeat()
    gpus = _gpu_names(spec) if spec.on_gpu else []
    for g in gpus:
        tf.config.experimental.reset_memory_stats(g)
    cpu_stats = not gpus and _reset_cpu_stats()
    timed_steps = max(1, spec.steps - 1)
    with _PeakSampler() as sampler:
        fit = dict(epochs=1, verbose=0, shuffle=False)
        model.fit(ds, steps_per_epoch=1, **fit)  # warm-up: tracing
        start = time.perf_counter()
        model.fit(ds, steps_per_epoch=timed_steps, **fit)
        elapsed = time.perf_counter() - start
        if elapsed < spec.timed_seconds:
            # Too short to time reliably: time enough steps for ~MIN seconds.
            timed_steps = math.ceil(
                spec.timed_seconds / max(elapsed / timed_steps, 1e-4)
            )
            timed_steps = min(timed_steps, 1000)
            start = time.perf_counter()
            model.fit(ds, steps_per_epoch=timed_steps, **fit)
            elapsed = time.perf_counter() - start
        if spec.validate:
            model.evaluate(ds, steps=1, verbose=0)
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
        "samples_per_s": global_batch * timed_steps / elapsed if elapsed > 0 else None,
    }


def build_probe_model(
    model: Any, spec: ProbeSpec, instance: Any = None, *, own_copy: bool = False
) -> Any:
    """`model` re-created under the spec's policy and strategy (or the user's
    strategy `instance`), compiled, with the spec's gradient accumulation:
    what `fit` would train.

    With `own_copy` (a child's freshly loaded model), a model that already
    matches the plan is trained as it is, as `fit` would: a needless clone
    would double its weights in memory and make the probe pessimistic.
    """
    from kerascale import accumulation, precision, strategy

    # strategy.build reads only these two fields of a Plan.
    plan_view = types.SimpleNamespace(strategy=spec.strategy, devices=spec.devices)
    dist = strategy.build(plan_view, instance)
    matches = (
        spec.policy == model.dtype_policy.name
        and spec.strategy == "default"
        and instance is None
    )
    new = model if own_copy and matches else precision.rebuild(model, spec.policy, dist)
    if spec.accumulation_steps > 1:
        accumulation.apply(new, spec.accumulation_steps)
    return new


# --- Child process ---------------------------------------------------------------


def _child_main(argv: list[str]) -> int:
    """`python -m kerascale.probe DIR B1,B2,...`: DIR holds spec.json,
    model.keras and objects.json. Probes the batches in order, writing
    result-B.json after each, and stops at the first that does not fit."""
    workdir, batches = argv[0], [int(b) for b in argv[1].split(",")]
    spec = ProbeSpec.from_json(_read(os.path.join(workdir, "spec.json")))

    def write(batch, payload):
        path = os.path.join(workdir, f"result-{batch}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(payload, f)
        os.replace(path + ".tmp", path)

    def failure(batch, e):
        outcome = OOM if _is_oom_exception(e) else ERROR
        text = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc()[-6000:]
        write(batch, {"outcome": outcome, "message": text[-2000:], "traceback": tb})

    try:
        model = _child_setup(workdir, spec)
    except BaseException as e:  # reported against the first batch
        failure(batches[0], e)
        return 0
    for batch in batches:
        try:
            write(batch, {"outcome": OK, **train_probe(model, spec, batch)})
        except BaseException as e:
            failure(batch, e)
            return 0
    return 0


def _child_setup(workdir: str, spec: ProbeSpec) -> Any:
    import tensorflow as tf

    if spec.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * spec.logical_cpus
        )
    if spec.on_gpu and spec.memory_limit:
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(spec.memory_limit >> 20)]
            )
    import keras

    from kerascale import memory

    objects = json.loads(_read(os.path.join(workdir, "objects.json")))
    model = keras.saving.load_model(
        os.path.join(workdir, "model.keras"),
        custom_objects=_import_objects(objects),
        safe_mode=False,  # the model comes from the parent process itself
    )
    model = build_probe_model(model, spec, own_copy=True)
    with open(os.path.join(workdir, "baseline.json"), "w") as f:
        json.dump({"data_bytes": memory.data_bytes()}, f)
    return model


def _is_oom_exception(e: BaseException) -> bool:
    import tensorflow as tf

    if isinstance(e, tf.errors.ResourceExhaustedError | MemoryError):
        return True
    return looks_like_oom(f"{type(e).__name__}: {e}")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _import_objects(entries: list[dict[str, str]]) -> dict[str, Any]:
    """Imports the user's custom objects by module and name; a script's
    `__main__` is loaded from its file, as multiprocessing's spawn does."""
    import runpy

    out: dict[str, Any] = {}
    main_ns = None
    for entry in entries:
        module, qualname = entry["module"], entry["qualname"]
        if module == "__main__":
            if main_ns is None:
                main_ns = runpy.run_path(entry["main_file"], run_name="__mp_main__")
            obj = main_ns[qualname.split(".")[0]]
        else:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        out[entry["name"]] = obj
    return out


# --- Shipping a model to a child -------------------------------------------------


def custom_objects(model: Any) -> tuple[list[dict[str, str]], str]:
    """The user's own classes and functions that a child must import to load
    `model`, and "" if they can all be shipped, else why not."""
    import keras

    found: dict[int, Any] = {}

    def note(obj):
        if isinstance(obj, types.FunctionType | type):
            target = obj
        elif isinstance(obj, str | int | float | bool | type(None)):
            return
        else:  # a loss, metric or optimizer instance
            target = type(obj)
        if not _is_library(getattr(target, "__module__", "")):
            found[id(target)] = target

    def visit(obj):
        if isinstance(obj, dict):
            for v in obj.values():
                visit(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                visit(v)
        else:
            note(obj)

    for layer in _all_layers(model):
        note(layer)
    compiled = getattr(model, "_compile_config", None)  # the compile() arguments
    if compiled is not None:
        visit(dict(compiled.config))
    entries, problems = [], []
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    for obj in found.values():
        module = obj.__module__
        qualname = obj.__qualname__
        if "<lambda>" in qualname or "<locals>" in qualname:
            problems.append(f"{qualname} is defined inside a function")
            continue
        if module == "__main__" and not main_file:
            problems.append(f"{qualname} is defined in a notebook or REPL")
            continue
        entry = {"module": module, "qualname": qualname, "name": obj.__name__}
        if module == "__main__":
            entry["main_file"] = os.path.abspath(main_file)
        entries.append(entry)
        registered = keras.saving.get_registered_name(obj)
        if registered and registered != obj.__name__:
            entries.append({**entry, "name": registered})
    return entries, "; ".join(problems)


def _is_library(module: str) -> bool:
    return (module or "").split(".")[0] in (
        "keras",
        "tensorflow",
        "tf_keras",
        "builtins",
        "numpy",
        "kerascale",
    )


def _all_layers(model: Any) -> Iterator[Any]:
    seen = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        stack.extend(getattr(layer, "_layers", ()) or ())
        stack.extend(getattr(layer, "layers", ()) or ())


# The child sets its own limit before anything else is imported (a preexec_fn
# would run between fork and exec, which is unsafe in a threaded parent).
_BOOTSTRAP = (
    "import resource, runpy, sys\n"
    "limit = int(sys.argv[1])\n"
    "if limit:\n"
    "    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))\n"
    "sys.argv = ['kerascale.probe', *sys.argv[2:]]\n"
    "runpy.run_module('kerascale.probe', run_name='__main__', alter_sys=True)\n"
)


class IsolatedProber:
    """Runs each probe in a child process under a real memory limit.

    Use as a context manager: it saves the model once into a private temp dir
    and removes the dir on exit, whatever happened.
    """

    def __init__(self, model: Any, spec: ProbeSpec, *, timeout: float = 600.0):
        self.model = model
        self.spec = spec
        self.timeout = timeout
        self.workdir: str | None = None

    def __enter__(self) -> IsolatedProber:
        self.workdir = tempfile.mkdtemp(prefix="kerascale-probe-")  # mode 0700
        try:
            entries, problem = custom_objects(self.model)
            if problem:
                from kerascale.errors import BatchSizeSearchError

                raise BatchSizeSearchError(
                    "isolate=True, but the model cannot be loaded in a child "
                    f"process: {problem}. Move it to an importable module, or "
                    'pass isolate="auto" or False to probe in this process.'
                )
            self.model.save(os.path.join(self.workdir, "model.keras"))
            with open(os.path.join(self.workdir, "objects.json"), "w") as f:
                json.dump(entries, f)
            with open(os.path.join(self.workdir, "spec.json"), "w") as f:
                f.write(self.spec.to_json())
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __call__(self, batch: int) -> ProbeResult:
        return self.sweep([batch])[0]

    def sweep(self, batches: list[int]) -> list[ProbeResult]:
        """Probes `batches` in order in one child process, which saves a
        TensorFlow start-up per batch; stops at the first that does not fit.
        A batch that runs out of memory after others in the same child is
        probed again alone: near the limit, what the smaller batches left
        behind (arenas, caches) can tip it over (measured: a convnet's 2216
        failed after 1500 in one child, and fits alone)."""
        results = self._run(batches, self.spec.memory_limit)
        last = results[-1]
        if len(results) > 1 and last.outcome != OK:
            alone = self.sweep([last.batch])[0]
            results[-1] = dataclasses.replace(
                alone, seconds=alone.seconds + last.seconds
            )
            return results
        if (
            last.outcome == ERROR
            and self.spec.memory_limit
            and not self.spec.on_gpu
            and "timed out" not in last.message
        ):
            # Under a tight limit, failures need not say "memory": a silent
            # SIGSEGV, or oneDNN's "could not create a primitive". Such a
            # failure is the limit's doing only if the same probe passes with
            # room to spare; otherwise it is reported as the error it is.
            retry = self._run([last.batch], self.spec.memory_limit * 2)[-1]
            if retry.outcome == OK:
                first_line = last.message.strip().splitlines()[0][:300]
                results[-1] = dataclasses.replace(
                    last,
                    outcome=OOM,
                    seconds=last.seconds + retry.seconds,
                    message=f"{first_line} (it passed with twice the memory, so "
                    "the limit caused it)",
                )
        return results

    def baseline_bytes(self) -> int | None:
        """Data memory of the last child after loading the model, before any
        batch: TensorFlow's own baseline, which no batch can go below."""
        try:
            return json.loads(_read(os.path.join(self.workdir, "baseline.json")))[
                "data_bytes"
            ]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _run(self, batches: list[int], limit: int | None) -> list[ProbeResult]:
        workdir = self.workdir
        if workdir is None:
            raise RuntimeError("IsolatedProber used outside its `with` block.")
        for name in os.listdir(workdir):
            if name.startswith(("result-", "baseline")):
                os.remove(os.path.join(workdir, name))
        env = dict(os.environ)
        # A probe runs alone: it must not read this worker's cluster.
        for name in ("TF_CONFIG", "CLUSTER_SPEC"):
            env.pop(name, None)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        rlimit = 0 if self.spec.on_gpu or not limit else limit
        arg = ",".join(str(b) for b in batches)
        start = time.perf_counter()
        with open(os.path.join(workdir, "stderr.txt"), "w+b") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(rlimit), workdir, arg],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=workdir,
                start_new_session=True,  # its own process group, killed as one
            )
            timed_out = False
            try:
                proc.wait(timeout=self.timeout * len(batches))
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()  # reaped: no zombie
            err.seek(0)
            stderr = err.read().decode("utf-8", "replace")[-4000:]
        seconds = time.perf_counter() - start
        results = []
        for batch in batches:
            path = os.path.join(workdir, f"result-{batch}.json")
            if not os.path.exists(path):
                results.append(
                    self._crash(batch, proc.returncode, timed_out, stderr, seconds)
                )
                break
            r = json.loads(_read(path))
            message = r.get("message", "")
            if r["outcome"] == ERROR:
                message += "\n" + r.get("traceback", "")
            results.append(
                ProbeResult(
                    batch,
                    r["outcome"],
                    peak_bytes=r.get("peak_bytes"),
                    samples_per_s=r.get("samples_per_s"),
                    message=message,
                    tensor_peak_bytes=r.get("tensor_peak_bytes"),
                )
            )
            if r["outcome"] != OK:
                break
        # The child's start-up is shared; each probe is charged an equal part.
        share = seconds / len(results)
        return [dataclasses.replace(r, seconds=share) for r in results]

    def _crash(self, batch, code, timed_out, stderr, seconds) -> ProbeResult:
        if timed_out:
            return ProbeResult(
                batch,
                ERROR,
                message=f"timed out after {self.timeout:g}s per batch and was killed",
            )
        detail = _stderr_summary(stderr)
        if code is not None and code < 0:
            sig = signal.Signals(-code).name
            if looks_like_oom(stderr):
                return ProbeResult(batch, OOM, message=f"killed by {sig}: {detail}")
            if sig == "SIGKILL":
                return ProbeResult(
                    batch,
                    OOM,
                    message="killed by SIGKILL (the kernel's out-of-memory killer)",
                )
            return ProbeResult(batch, ERROR, message=f"crashed with {sig}: {detail}")
        if looks_like_oom(stderr):
            return ProbeResult(batch, OOM, message=f"exit code {code}: {detail}")
        return ProbeResult(
            batch, ERROR, message=f"crashed with exit code {code}: {detail}"
        )


def _stderr_summary(stderr: str) -> str:
    """The line of a crashed child's stderr that says what happened, not the
    stack frames and start-up chatter around it."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    telling = ("what():", "bad_alloc", "Check failed", "Error", "error:", "Killed")
    noise = ("@ ", "*** ", "PC: ")
    for line in reversed(lines):
        if (
            any(t in line for t in telling)
            and not line.startswith(noise)
            and ("cuInit" not in line and "cuda_platform" not in line)
        ):
            return line[:300]
    quiet = [ln for ln in lines if not ln.startswith(noise)]
    return (quiet[-1] if quiet else "no output")[:300]


# --- In-process ------------------------------------------------------------------


@contextlib.contextmanager
def preserved_state() -> Iterator[None]:
    """Restores Python's and NumPy's global random state and Keras's dtype
    policy: re-creating a model draws initializer seeds from Python's RNG."""
    import keras

    py, np_state = random.getstate(), np.random.get_state()
    policy = keras.config.dtype_policy()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        keras.config.set_dtype_policy(policy)


class InProcessProber:
    """Runs each probe on a clone in this process."""

    def sweep(self, batches: list[int]) -> list[ProbeResult]:
        results = []
        for b in batches:
            results.append(self(b))
            if results[-1].outcome != OK:
                break
        return results

    def baseline_bytes(self) -> int | None:
        return None

    def __init__(self, model: Any, spec: ProbeSpec, *, strategy: Any = None):
        self.model = model
        self.spec = spec
        self.strategy = strategy  # the user's own instance, if any

    def __enter__(self) -> InProcessProber:
        return self

    def __exit__(self, *exc) -> None:
        import gc

        gc.collect()

    def __call__(self, batch: int) -> ProbeResult:
        import gc

        import tensorflow as tf

        start = time.perf_counter()
        clone = None
        try:
            with preserved_state():
                clone = build_probe_model(self.model, self.spec, self.strategy)
                r = train_probe(clone, self.spec, batch)
        except (tf.errors.ResourceExhaustedError, MemoryError) as e:
            return ProbeResult(
                batch,
                OOM,
                seconds=time.perf_counter() - start,
                message=f"{type(e).__name__}: {str(e)[:500]}",
            )
        finally:
            del clone
            gc.collect()
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


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
