"""What hardware is here: CPU, GPUs, TPU and the cluster around this process.

`detect_hardware()` is the only place kerascale asks the machine about itself.
Everything downstream (strategy, precision, batch search) reads the frozen
`Hardware` it returns, which makes this module the one seam that tests replace
with a fake GPU box, TPU host or cluster.

Detection never raises because a driver, NVML or a TPU runtime is missing; what
could not be learnt is recorded in `Hardware.notes`. It also never initialises
the TensorFlow runtime (it only lists *physical* devices and reads logical
device *configuration*), so a user may still configure devices afterwards.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import platform
from collections.abc import Mapping
from typing import Any

from kerascale import _validation
from kerascale.errors import ConfigurationError
from kerascale.sense import backend as backend_lib
from kerascale.sense import jax_devices, jax_processes
from kerascale.sense import nvml as nvml_lib
from kerascale.sense.cluster import ClusterInfo, detect_cluster

logger = logging.getLogger("kerascale")

# CPU flags (as /proc/cpuinfo spells them) that give native bfloat16 math, which
# is what makes `mixed_bfloat16` faster than float32 on a CPU.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

# Environment variables that only exist where a Cloud TPU is attached. Reading
# them is instant; a TPUClusterResolver would query the GCE metadata server.
_TPU_ENV_VARS = (
    "TPU_NAME",
    "COLAB_TPU_ADDR",
    "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
    "TPU_ACCELERATOR_TYPE",
)

# The hardware seam for several accelerators on a machine that has none: with
# it set to 1, JAX's CPU devices of one process (XLA_FLAGS=
# --xla_force_host_platform_device_count=N) are planned as GPUs would be.
STAND_IN_VARIABLE = "KERASCALE_CPU_DEVICES_STAND_IN"
# The hardware seam for the CPU itself, to run the suite as on another host
# (CONTRIBUTING.md): a JSON object whose keys "model", "cores" and "bf16"
# replace what this machine says, in this process and the children it starts.
CPU_SEAM_VARIABLE = "KERASCALE_CPU_SEAM"


@dataclasses.dataclass(frozen=True)
class CPUInfo:
    """The host CPU.

    Attributes:
        cores: CPU cores this process may run on (affinity-aware).
        model: The CPU model name, or "" where it cannot be read.
        bf16: Whether the CPU has native bfloat16 instructions.
        bf16_flags: Which of `BF16_CPU_FLAGS` were found.
        logical_devices: TensorFlow logical CPU devices configured for the first
            physical CPU, or JAX's CPU devices (more than one only when the user
            split it, as tests do to stand in for several GPUs).
        devices_stand_in: Whether those devices stand in for accelerators
            (`STAND_IN_VARIABLE`=1, the test suite's hardware seam): "auto"
            then splits the batch over them as over GPUs. Unset, CPU devices
            of one process share its cores, and "auto" trains on one.
    """

    cores: int
    model: str = ""
    bf16: bool = False
    bf16_flags: tuple[str, ...] = ()
    logical_devices: int = 1
    devices_stand_in: bool = False


@dataclasses.dataclass(frozen=True)
class GPUInfo:
    """One GPU that TensorFlow can use.

    Attributes:
        index: TensorFlow's index (`/GPU:index`).
        name: The product name, e.g. "NVIDIA A100-SXM4-40GB".
        memory_total: Device memory in bytes, from NVML; None if unknown.
        compute_capability: (major, minor), e.g. (8, 0); None if unknown.
    """

    index: int
    name: str = "GPU"
    memory_total: int | None = None
    compute_capability: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class TPUInfo:
    """A Cloud TPU that this process appears to be attached to.

    Attributes:
        name: What to pass to `TPUClusterResolver(tpu=...)`: a TPU name, an
            address, or "local" on a TPU VM.
        source: What revealed it (an environment variable or a device file).
    """

    name: str
    source: str


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Everything kerascale knows about where it runs.

    Build a fake one in tests: `Hardware(cpu=CPUInfo(cores=8), gpus=(GPUInfo(0,
    "A100", 40 << 30, (8, 0)),))`.
    """

    cpu: CPUInfo
    gpus: tuple[GPUInfo, ...] = ()
    tpu: TPUInfo | None = None
    cluster: ClusterInfo | None = None
    notes: tuple[str, ...] = ()
    backend: str = "tensorflow"

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def gpus_homogeneous(self) -> bool:
        """True when every GPU is the same product (vacuously with 0 or 1)."""
        return len({(g.name, g.compute_capability) for g in self.gpus}) <= 1

    @property
    def min_compute_capability(self) -> tuple[int, int] | None:
        """The lowest compute capability across GPUs; None if any is unknown."""
        caps = [g.compute_capability for g in self.gpus]
        if not caps or any(c is None for c in caps):
            return None
        return min(caps)

    @property
    def accelerator(self) -> str:
        """ "tpu", "gpu" or "cpu": what would run the model."""
        if self.tpu is not None:
            return "tpu"
        return "gpu" if self.gpus else "cpu"

    def summary(self) -> str:
        """One line for the plan table, e.g. "2x NVIDIA A100 (40.0 GiB, cc 8.0)"."""
        if self.tpu is not None:
            return f"TPU {self.tpu.name!r} (from {self.tpu.source})"
        if self.gpus:
            parts = []
            for name in dict.fromkeys(g.name for g in self.gpus):
                same = [g for g in self.gpus if g.name == name]
                g = same[0]
                extra = []
                if g.memory_total:
                    extra.append(f"{g.memory_total / 2**30:.1f} GiB")
                if g.compute_capability:
                    extra.append("cc {}.{}".format(*g.compute_capability))
                detail = f" ({', '.join(extra)})" if extra else ""
                parts.append(f"{len(same)}x {name}{detail}")
            return " + ".join(parts)
        bf16 = "bf16" if self.cpu.bf16 else "no bf16"
        model = f"{self.cpu.model}, " if self.cpu.model else ""
        n = self.cpu.logical_devices
        devices = f", {n} devices" if n > 1 else ""
        return f"CPU ({model}{self.cpu.cores} cores, {bf16}{devices})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hardware:
        """Inverse of `to_dict`."""
        cpu = CPUInfo(**{**d["cpu"], "bf16_flags": tuple(d["cpu"]["bf16_flags"])})
        gpus = tuple(
            GPUInfo(
                **{
                    **g,
                    "compute_capability": tuple(g["compute_capability"])
                    if g.get("compute_capability")
                    else None,
                }
            )
            for g in d.get("gpus", ())
        )
        tpu = TPUInfo(**d["tpu"]) if d.get("tpu") else None
        cluster = ClusterInfo(**d["cluster"]) if d.get("cluster") else None
        return cls(
            cpu=cpu,
            gpus=gpus,
            tpu=tpu,
            cluster=cluster,
            notes=tuple(d["notes"]),
            backend=d.get("backend", "tensorflow"),
        )


def detect_hardware(*, nvml: bool = True) -> Hardware:
    """Detects the CPU, GPUs, TPU and cluster environment of this process.

    Never raises for missing drivers or libraries; what could not be learnt is
    said in `Hardware.notes`. Does not initialise the TensorFlow runtime.

    Args:
        nvml: Whether to ask NVML (the `nvidia-ml-py` package) for each GPU's
            memory size. Without it, memory is unknown. Defaults to `True`.

    Returns:
        A frozen `Hardware`.

    Raises:
        ConfigurationError: If `nvml` is not a bool.

    Example:

    >>> hw = kerascale.detect_hardware()
    >>> hw.accelerator in ("cpu", "gpu", "tpu")
    True
    """
    _validation.boolean("nvml", nvml)
    notes: list[str] = []
    backend = backend_lib.name()
    cluster = detect_cluster(os.environ)
    if backend == "jax":
        cpu, gpus, tpu, cluster = _detect_jax(notes, use_nvml=nvml)
    elif backend == "tensorflow":
        cpu = _detect_cpu(notes, logical_devices=_logical_device_count("CPU"))
        gpus = _detect_gpus(notes, use_nvml=nvml)
        tpu = _detect_tpu(os.environ)
    else:  # kerascale plans nothing there; what Keras would use, unasked
        cpu, gpus, tpu = _detect_cpu(notes), (), None
    return Hardware(
        cpu=cpu,
        gpus=gpus,
        tpu=tpu,
        cluster=cluster,
        notes=tuple(notes),
        backend=backend,
    )


def _detect_jax(
    notes: list[str], *, use_nvml: bool
) -> tuple[CPUInfo, tuple[GPUInfo, ...], TPUInfo | None, ClusterInfo | None]:
    """The devices JAX trains on here (`sense.jax_devices`), with NVML's
    names where it knows them, and its processes: those joined
    (`JOINED`), else those the environment describes (not joined)."""
    found = jax_devices.detect(notes)
    cpu = _detect_cpu(notes, logical_devices=max(1, found["cpu_devices"]))
    if os.environ.get(STAND_IN_VARIABLE) == "1":
        cpu = dataclasses.replace(cpu, devices_stand_in=True)
    gpus = tuple(
        GPUInfo(g["index"], g["name"], g["memory_total"], g["cc"])
        for g in found["gpus"]
    )
    nvml_gpus = nvml_lib.nvml_gpus(notes) if gpus and use_nvml else None
    if nvml_gpus:
        gpus = tuple(
            nvml_lib.enrich(g, nvml_gpus, notes, keep_memory=True) for g in gpus
        )
    tpu = None
    if found["tpu_cores"]:
        tpu = TPUInfo(name="local", source=f"JAX ({found['tpu_cores']} TPU cores)")
    if found["processes"] > 1:
        cluster = ClusterInfo(
            jax_processes.JOINED, found["processes"], "worker", found["process_index"]
        )
    else:
        described = jax_processes.describe(os.environ)
        cluster = described and ClusterInfo(
            described.source,
            described.num_processes or 0,
            "worker",
            described.process_id,
            described.error or None,
        )
    return cpu, gpus, tpu, cluster


# --- CPU --------------------------------------------------------------------


def _read_cpuinfo() -> str:
    return _read_text("/proc/cpuinfo")


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Returns (model name, flags) from the text of /proc/cpuinfo."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def _cpu_cores() -> int:
    """Cores this process may use: CPU affinity, capped by a cgroup v2 quota
    (a container started with --cpus=2 on a 64-core host has 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(_read_text("/sys/fs/cgroup/cpu.max"))
    return max(1, min(cores, quota)) if quota else cores


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _cgroup_cpu_quota(text: str) -> int | None:
    """Whole CPUs from cgroup v2 `cpu.max` ("200000 100000" -> 2); None when
    unlimited ("max 100000") or unreadable."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return max(1, -(-quota // period)) if quota > 0 and period > 0 else None


def _detect_cpu(notes: list[str], *, logical_devices: int = 1) -> CPUInfo:
    model, flags = parse_cpuinfo(_read_cpuinfo())
    if not flags:
        notes.append(
            f"CPU flags are not readable on {platform.system() or 'this OS'}: "
            "bf16 support is assumed absent."
        )
    found = tuple(f for f in BF16_CPU_FLAGS if f in flags)
    cpu = CPUInfo(
        cores=_cpu_cores(),
        model=model or platform.processor(),
        bf16=bool(found),
        bf16_flags=found,
        logical_devices=logical_devices,
    )
    seam = os.environ.get(CPU_SEAM_VARIABLE)
    return _as_seam_says(cpu, seam) if seam else cpu


def _as_seam_says(cpu: CPUInfo, seam: str) -> CPUInfo:
    """`cpu` with what `CPU_SEAM_VARIABLE`'s JSON replaces."""
    try:
        said = json.loads(seam)
        if not isinstance(said, dict) or set(said) - {"model", "cores", "bf16"}:
            raise ValueError("not an object of model, cores, bf16")
        cores = int(said.get("cores", cpu.cores))
        bf16 = bool(said.get("bf16", cpu.bf16))
        model = str(said.get("model", cpu.model))
        if cores < 1:
            raise ValueError("cores below 1")
    except (TypeError, ValueError) as e:
        raise ConfigurationError(
            f"{CPU_SEAM_VARIABLE} must be a JSON object with any of the keys "
            f'"model" (a str), "cores" (an int >= 1) and "bf16" (a bool), or '
            f"unset to read this machine ({e}). Received: {CPU_SEAM_VARIABLE}="
            f"{seam!r}"
        ) from None
    flags = (cpu.bf16_flags or ("amx_bf16",)) if bf16 else ()
    return dataclasses.replace(
        cpu, model=model, cores=cores, bf16=bf16, bf16_flags=flags
    )


def _logical_device_count(kind: str) -> int:
    """Logical devices configured on the first physical `kind` device.

    Reads the configuration only, which, unlike `list_logical_devices`, does
    not initialise the runtime.
    """
    import tensorflow as tf

    physical = tf.config.list_physical_devices(kind)
    if not physical:
        return 0
    try:
        configured = tf.config.get_logical_device_configuration(physical[0])
    except (RuntimeError, ValueError):
        configured = None
    return len(configured) if configured else 1


# --- GPUs -------------------------------------------------------------------


def _detect_gpus(notes: list[str], *, use_nvml: bool) -> tuple[GPUInfo, ...]:
    import tensorflow as tf

    try:
        physical = tf.config.list_physical_devices("GPU")
    except Exception as e:  # A broken CUDA install must not stop training on CPU.
        notes.append(f"TensorFlow could not list GPUs ({e}).")
        physical = []
    gpus = []
    for i, device in enumerate(physical):
        try:
            details = tf.config.experimental.get_device_details(device)
        except Exception:
            details = {}
        cc = details.get("compute_capability")
        gpus.append(
            GPUInfo(
                index=i,
                name=details.get("device_name") or "GPU",
                compute_capability=tuple(cc) if cc else None,
            )
        )
    nvml_notes: list[str] = []
    nvml_gpus = nvml_lib.nvml_gpus(nvml_notes) if use_nvml else None
    if nvml_gpus is None:
        if gpus:
            why = (
                nvml_notes[0]
                if nvml_notes
                else (
                    "install nvidia-ml-py (kerascale[gpu])"
                    if use_nvml
                    else "nvml=False"
                )
            )
            notes.append(f"GPU memory size unknown: NVML not used ({why}).")
        return tuple(gpus)
    notes += nvml_notes
    if not gpus and nvml_gpus:
        notes.append(
            f"NVML sees {len(nvml_gpus)} GPU(s) but TensorFlow cannot use them "
            "(a CPU-only TensorFlow build, or CUDA libraries missing): training "
            "runs on CPU. `pip install tensorflow[and-cuda]` gives TensorFlow "
            "its CUDA libraries."
        )
        return ()
    return tuple(nvml_lib.enrich(g, nvml_gpus, notes) for g in gpus)


# --- TPU --------------------------------------------------------------------


def _detect_tpu(env: Mapping[str, str]) -> TPUInfo | None:
    for var in _TPU_ENV_VARS:
        value = env.get(var, "").strip()
        if value:
            name = value if var in ("TPU_NAME", "COLAB_TPU_ADDR") else "local"
            if var == "COLAB_TPU_ADDR":
                name = f"grpc://{value}"
            return TPUInfo(name=name, source=var)
    devices = glob.glob("/dev/accel[0-9]*")
    if devices:
        return TPUInfo(name="local", source=devices[0])
    return None
