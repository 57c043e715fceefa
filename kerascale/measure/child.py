"""Probes in child processes: a crash there never harms the caller.

Its design: docs/design/modules.md, `kerascale.measure.child`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kerascale.apply.session import Session
from kerascale.measure import fit_process, fork_server, probe_data, shipping
from kerascale.measure.probe import ProbeSpec, build_probe_model, train_probe
from kerascale.measure.result import ERROR, OK, OOM, ProbeResult
from kerascale.sense import memory
from kerascale.sense.model_facts import gist
from kerascale.sense.oom import is_oom_exception, looks_like_oom

if TYPE_CHECKING:
    from kerascale.measure.host_share import HostShare


def _child_main(argv: list[str]) -> int:
    """`python -m kerascale.measure.child DIR B1,B2,... [LIMIT]`: DIR holds
    spec.json, model.keras and objects.json; LIMIT is the resident memory
    allowed on CPU (bytes; 0 for none). Probes the batches in order, writing
    result-B.json after each, and stops at the first that does not fit."""
    workdir, batches = argv[0], [int(b) for b in argv[1].split(",")]
    spec = ProbeSpec.from_json(_read(os.path.join(workdir, "spec.json")))
    limit = int(argv[2]) if len(argv) > 2 and not spec.on_gpu else 0
    if limit and spec.share().measured:
        limit = fit_process.with_slack(limit)

    def write(batch, payload):
        path = os.path.join(workdir, f"result-{batch}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(payload, f)
        os.replace(path + ".tmp", path)

    def failure(batch, e, **extra):
        outcome = OOM if is_oom_exception(e) else ERROR
        text = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc()[-6000:]
        payload = {"outcome": outcome, "message": text[-2000:], "traceback": tb}
        write(batch, {**payload, **extra})

    # Until the baseline is known, the limit as it is (the setup is the
    # same in the process where fit trains, and there its data besides).
    current: dict[str, Any] = {"batch": batches[0], "limit": limit, "allowed": limit}
    if limit:
        _watch_resident(current, write)
    share = spec.share()
    element = probe_data.decode_structure(spec.element)
    try:
        model, unbuilt, arrays, activation = _child_setup(workdir, spec, element, share)
    except BaseException as e:  # reported against the first batch
        failure(batches[0], e, stage="setup")
        return 0
    memory.release_freed()
    counts = fit_process.AsFitProcess(
        base=(memory.resident_bytes() or 0) - unbuilt,
        share=share,
        # A batch repeated is held twice (as arrays and as a tensor), where
        # the process where fit trains holds its batches as its input's
        # pipeline does (counted in the share).
        sample=(
            probe_data.sample_bytes(element) if share.measured and arrays is None else 0
        ),
        # What a long run adds to a short probe's growth (LONG_RUN_SPREAD),
        # and what another order of the step's ops holds, per sample.
        spread=fit_process.LONG_RUN_SPREAD if arrays is not None and limit else 0.0,
        op_order=activation if limit else 0,
    )
    for batch in batches:
        global_batch = spec.global_batch(batch)
        current["batch"] = batch
        if limit:
            current.update(
                limit=counts.watched(limit, global_batch),
                counts=counts,
                global_batch=global_batch,
            )
        try:
            result = train_probe(model, spec, batch, in_child=True, arrays=arrays)
        except BaseException as e:
            failure(batch, e)
            return 0
        result["peak_bytes"] = counts.peak(result["peak_bytes"], global_batch)
        if result["tensor_peak_bytes"] is not None:
            result["tensor_peak_bytes"] += share.held_bytes(global_batch)
        if limit and result["peak_bytes"] > limit:  # both as fit's process
            over = _over(result["peak_bytes"], limit)
            write(batch, {"outcome": OOM, **result, "message": over})
            return 0
        write(batch, {"outcome": OK, **result})
    return 0


def _over(peak: int, limit: int) -> str:
    """Why a probe is out of memory; `peak` and `limit` both count the
    process where fit trains (the limit less what is kept below it)."""
    return (
        f"resident {peak / 2**20:.0f} MiB, over the {limit / 2**20:.0f} MiB "
        "allowed, as the process where fit trains counts both"
    )


def _watch_resident(
    current: dict[str, Any], write: Callable[[int, dict[str, Any]], None]
) -> None:
    """Stops the child the moment its resident memory passes
    `current["limit"]` (the limit less what the process where fit trains
    holds beyond this child), as a container's limit would (the exact peak
    is also checked after each probe: a spike shorter than the watch's
    millisecond is not lost). It reports what a probe that ends reports:
    the peak as the process where fit trains reaches it (`current["counts"]`,
    an `AsFitProcess`, at its global batch), against the limit allowed, not
    the child's share of it."""
    import threading

    def watch() -> None:
        while True:
            now, limit = memory.resident_bytes(), current["limit"]
            if now is not None and now > limit:
                counts, counted = current.get("counts"), current["allowed"]
                peak = counts.peak(now, current["global_batch"]) if counts else now
                write(
                    current["batch"],
                    {
                        "outcome": OOM,
                        "peak_bytes": peak,
                        "message": _over(peak, counted)
                        + "; stopped by kerascale's watch",
                    },
                )
                os._exit(0)
            time.sleep(0.001)

    threading.Thread(target=watch, name="kerascale-resident-watch", daemon=True).start()


def _child_setup(workdir: str, spec: ProbeSpec, element: Any, share: HostShare) -> Any:
    """(the model, its optimizer's bytes to count, `share.child_arrays`
    synthetic arrays of the per-sample `element` or None, the bytes a sample
    puts in the model's largest layer output): arrays are held as the user's
    process holds them, before the baseline, and trained through fit."""
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

    objects = json.loads(_read(os.path.join(workdir, "objects.json")))
    model = keras.saving.load_model(
        os.path.join(workdir, "model.keras"),
        custom_objects=shipping.import_objects(objects),
        safe_mode=False,  # the model comes from the parent process itself
    )
    # Loading built the optimizer's state, which the process where fit
    # trains builds in fit: the baseline leaves it out, so that it counts.
    unbuilt = 0 if spec.optimizer_built else _optimizer_bytes(model)
    activation = fit_process.op_order_bytes(model, spec.policy)
    # The child's process ends with the probe: nothing to undo, so the
    # session is left open on purpose.
    model = build_probe_model(Session(), model, spec, own_copy=True)
    with open(os.path.join(workdir, "baseline.json"), "w") as f:
        json.dump({"resident_bytes": memory.resident_bytes()}, f)
    samples = share.child_arrays
    arrays = probe_data.synthetic_arrays(element, samples) if samples else None
    return model, unbuilt, arrays, activation


def _optimizer_bytes(model: Any) -> int:
    """The bytes of the model's optimizer's variables."""
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    total = 0
    for v in getattr(optimizer, "variables", None) or []:
        total += int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
    return total


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# The child sets its safety net before anything else is imported (a preexec_fn
# would run between fork and exec, which is unsafe in a threaded parent).
_BOOTSTRAP = (
    "import resource, runpy, sys\n"
    "limit = int(sys.argv[1])\n"
    "if limit:\n"
    "    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))\n"
    "sys.argv = ['kerascale.measure.child', *sys.argv[2:]]\n"
    "runpy.run_module('kerascale.measure.child', run_name='__main__', alter_sys=True)\n"
)


def safety_net(limit: int) -> int:
    """The child's `RLIMIT_DATA` under a resident `limit`: far above it, so
    that only a runaway allocation meets it. Virtual data memory runs ahead
    of resident memory by the threads' stacks and the allocators' reserved
    arenas (about 1 GiB for TensorFlow on 2 cores)."""
    return 4 * limit + (4 << 30)


class CannotShip(Exception):
    """The model cannot be probed in a child process (the message says
    why): the search probes it in this process instead."""


class IsolatedProber:
    """Runs each probe in a child process under a real memory limit.

    Use as a context manager: it saves the model once into a private temp dir
    and removes the dir on exit, whatever happened.
    """

    def __init__(
        self,
        model: Any,
        spec: ProbeSpec,
        *,
        timeout: float = 600.0,
        fork: bool | None = None,
    ):
        """`fork`: children forked from a fork server (fork_server.py), as
        `placement.place` decides; None for CPU probes only (a GPU's driver
        must not be initialised before a fork)."""
        self.model = model
        self.spec = spec
        self.timeout = timeout
        self.fork = not spec.on_gpu if fork is None else fork and not spec.on_gpu
        self.workdir: str | None = None
        self._server: fork_server.ForkServer | bool | None = None

    def __enter__(self) -> IsolatedProber:
        self.workdir = tempfile.mkdtemp(prefix="kerascale-probe-")  # mode 0700
        try:
            entries, problem = shipping.custom_objects(self.model)
            if problem:
                raise CannotShip(problem)
            try:
                self.model.save(os.path.join(self.workdir, "model.keras"))
            except Exception as e:
                raise CannotShip(
                    f"it cannot be saved for a child ({type(e).__name__}: {gist(e)})"
                ) from e
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
        if self._server:
            self._server.close()
        self._server = None
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
            and not last.timed_out
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
        """Resident memory of the last child after loading the model, before
        any batch: TensorFlow's own baseline, which no batch can go below."""
        try:
            return json.loads(_read(os.path.join(self.workdir, "baseline.json")))[
                "resident_bytes"
            ]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _run(self, batches: list[int], limit: int | None) -> list[ProbeResult]:
        workdir = self.workdir
        if workdir is None:
            raise RuntimeError("IsolatedProber used outside its `with` block.")
        env = dict(os.environ)
        # A probe runs alone: it must not read this worker's cluster.
        for name in ("TF_CONFIG", "CLUSTER_SPEC"):
            env.pop(name, None)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if self.spec.share().threshold_fixed:
            # As in this process, where fit trains: a probe of several
            # batches then peaks at each as a fresh process does, and the
            # training as the probe did.
            env["MALLOC_MMAP_THRESHOLD_"] = str(memory.MMAP_THRESHOLD)
        # Absolute: the child runs in its own directory.
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
        limit = 0 if self.spec.on_gpu or not limit else limit
        argv = [workdir, ",".join(str(b) for b in batches), str(limit)]
        start = time.perf_counter()
        err = os.path.join(workdir, "stderr.txt")
        code, timed_out = self._child(
            argv, safety_net(limit) if limit else 0, err, env, len(batches)
        )
        with open(err, "rb") as f:
            stderr = f.read().decode("utf-8", "replace")[-4000:]
        seconds = time.perf_counter() - start
        results = []
        for batch in batches:
            path = os.path.join(workdir, f"result-{batch}.json")
            if not os.path.exists(path):
                results.append(self._crash(batch, code, timed_out, stderr, seconds))
                break
            r = json.loads(_read(path))
            if r.get("stage") == "setup" and r["outcome"] == ERROR:
                first = r.get("message", "").strip().splitlines() or ["?"]
                raise CannotShip(
                    f"a child process could not load it ({first[0][:300]})"
                )
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

    def _child(
        self, argv: list[str], rlimit: int, err: str, env: dict, batches: int
    ) -> tuple[int | None, bool]:
        """Runs a child to its end: (its exit code, whether it ran past the
        timeout and was killed). Forked from the fork server where there is
        one (CPU probes), else started as a process of its own."""
        timeout = self.timeout * batches
        server = self._fork_server(env)
        if server is not None:
            try:
                self._clear_results()
                server.spawn(argv, rlimit, err)
                code = server.wait(timeout)
                return code, code is None
            except fork_server.ServerGone:
                server.close()
                self._server = False  # the rest start on their own
        self._clear_results()  # what a child the server lost wrote
        with open(err, "w+b") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(rlimit), *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                cwd=self.workdir,
                start_new_session=True,  # its own process group, killed as one
            )
            try:
                return proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()  # reaped: no zombie
                return proc.returncode, True

    def _clear_results(self) -> None:
        for name in os.listdir(self.workdir):
            if name.startswith(("result-", "baseline")):
                os.remove(os.path.join(self.workdir, name))

    def _fork_server(self, env: dict) -> fork_server.ForkServer | None:
        """The search's fork server, started at the first CPU probe; None on
        GPUs, or where it could not start."""
        if self._server is None:
            self._server = False
            if self.fork:
                with contextlib.suppress(fork_server.ServerGone, OSError):
                    self._server = fork_server.ForkServer(env, self.workdir)
        return self._server or None

    def _crash(self, batch, code, timed_out, stderr, seconds) -> ProbeResult:
        if timed_out:
            return ProbeResult(
                batch,
                ERROR,
                message=f"timed out after {self.timeout:g}s per batch and was killed",
                timed_out=True,
            )
        detail = _stderr_summary(stderr)
        if "Check failed: ret == 0 (11 vs. 0)" in stderr and "Thread" in stderr:
            # pthread_create's EAGAIN: too many threads, not memory running out.
            return ProbeResult(
                batch,
                ERROR,
                message=f"a thread could not be created (EAGAIN), not memory: {detail}",
            )
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


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
