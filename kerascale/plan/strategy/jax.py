"""Which `keras.distribution` to train under on the JAX backend. Pure.

Several local GPUs or TPU cores -> `DataParallel` over all of them: Keras
splits each global batch across them and keeps the variables replicated (the
model trains as it is: JAX needs no scope, so nothing is re-created). One
device, or CPU devices made visible with
`XLA_FLAGS=--xla_force_host_platform_device_count=N` (they share the
process's cores) -> no distribution, Keras's default. A
`keras.distribution.Distribution` you pass, or set with
`keras.distribution.set_distribution` before `fit`, is used as it is.
Building the object is `kerascale.apply.jax`'s job.
"""

from __future__ import annotations

from typing import Any

import keras

from kerascale import _validation
from kerascale.errors import ConfigurationError
from kerascale.plan import sharding
from kerascale.plan.choice import StrategyChoice
from kerascale.sense import jax_processes
from kerascale.sense.cluster import check_trainable
from kerascale.sense.hardware import Hardware

CHOICES = ("auto", "default", "data_parallel")


def is_distribution(value: Any) -> bool:
    """Whether `value` is a `keras.distribution` Distribution (Keras exports
    its subclasses, not the base class: a subclass of the base is known by
    the methods Keras calls on one)."""
    public = (keras.distribution.DataParallel, keras.distribution.ModelParallel)
    return isinstance(value, public) or all(
        callable(getattr(value, name, None))
        for name in ("get_data_layout", "get_variable_layout", "distribute_dataset")
    )


def global_distribution() -> Any:
    """The distribution set with `keras.distribution.set_distribution`, or
    None."""
    return keras.distribution.distribution()


def validate_request(strategy: Any) -> None:
    """Accepts a name from `CHOICES` or a `keras.distribution.Distribution`."""
    if is_distribution(strategy):
        return
    if not isinstance(strategy, str) or strategy not in CHOICES:
        names = ", ".join(repr(c) for c in CHOICES)
        raise _validation.fail(
            "strategy",
            strategy,
            f"one of {names} (the JAX backend's), or a keras.distribution.Distribution",
        )


def devices(hw: Hardware) -> tuple[str, ...]:
    """JAX's names of the local devices that would hold a replica."""
    if hw.tpu is not None:
        cores = _tpu_cores(hw)
        return tuple(f"tpu:{i}" for i in range(cores))
    if hw.gpus:
        return tuple(f"gpu:{g.index}" for g in hw.gpus)
    return tuple(f"cpu:{i}" for i in range(max(1, hw.cpu.logical_devices)))


def _shared_cpu_devices(hw: Hardware, local: tuple[str, ...]) -> str:
    """Why "auto" keeps one of several CPU devices of this process, or "":
    they share its cores, so a batch split over them computes no faster than
    on one, and adds an all-reduce (the step at N is N x one device's share,
    `plan.scaling`'s shared compute); XLA's CPU all-reduce over two devices
    on 2 cores also stalled and aborted a 1024-wide MLP's fit, where one
    device trains. Not where they stand in for accelerators (tests)."""
    if len(local) < 2 or hw.gpus or hw.tpu is not None or hw.cpu.devices_stand_in:
        return ""
    return (
        f"{len(local)} CPU devices share {hw.cpu.cores} cores: one trains as fast "
        "(split over them a batch computes no faster and adds an all-reduce; "
        "Keras's JAX default, no keras.distribution; strategy='data_parallel' "
        "splits anyway)"
    )


def _tpu_cores(hw: Hardware) -> int:
    digits = "".join(c for c in hw.tpu.source.split("(")[-1] if c.isdigit())
    return int(digits) if digits else 1


def choose(hw: Hardware, requested: Any) -> StrategyChoice:
    """Picks the distribution for `requested` ("auto", a name, or an
    instance: the one set with `set_distribution` before `fit` arrives here
    as an instance, put in `Options` at the door).

    Raises:
        ConfigurationError: For a TensorFlow strategy name on JAX.
    """
    if is_distribution(requested):
        return _yours(requested)
    if isinstance(requested, sharding.Sharded):
        return _sharded(hw, requested)
    if requested not in CHOICES:
        raise ConfigurationError(
            f"strategy={requested!r} is a TensorFlow strategy, and Keras runs on "
            f"JAX here: use one of {', '.join(repr(c) for c in CHOICES)}, or a "
            "keras.distribution.Distribution."
        )
    local = devices(hw)
    cluster = ()
    if hw.cluster is not None and hw.cluster.error:
        check_trainable(hw.cluster)
    joined = _joined(hw)
    if joined and requested in ("auto", "data_parallel"):
        return _across_processes(hw, local)
    if hw.cluster is not None and hw.cluster.is_multi_worker and not joined:
        cluster = (
            f"{hw.cluster.source} describes {hw.cluster.num_workers} JAX "
            "processes, and this one has not joined them (kerascale joins at "
            "import, before JAX computes: import kerascale first, or set "
            "KERASCALE_AUTO_CONNECT=1): it trains on its own devices, as "
            "model.fit would.",
        )
    shared = _shared_cpu_devices(hw, local) if requested == "auto" else ""
    if requested == "default" or (requested == "auto" and len(local) == 1) or shared:
        why = "you asked for it" if requested == "default" else "one device"
        return StrategyChoice(
            "default",
            local[:1],
            1,
            shared or f"{why}: Keras's JAX default (no keras.distribution)",
            cluster,
            scoped=False,
        )
    warnings = cluster
    if len(local) == 1:
        warnings += (
            "strategy='data_parallel' with a single device trains one replica: "
            "no speed-up over 'default'.",
        )
    kind = local[0].split(":")[0].upper()
    why = (
        "you asked for it"
        if requested == "data_parallel"
        else (f"{len(local)} {kind} devices")
    )
    return StrategyChoice(
        "data_parallel",
        local,
        len(local),
        f"{why}: keras.distribution.DataParallel, the batch split across them",
        warnings,
        scoped=False,
    )


def _yours(requested: Any) -> StrategyChoice:
    """The user's own distribution, as it is."""
    mesh = getattr(requested, "device_mesh", None)
    names = (
        tuple(str(d) for d in getattr(mesh, "devices", ()).flatten())
        if (mesh is not None)
        else ()
    )
    yours = (
        "the keras.distribution set before fit (set_distribution)"
        if requested is global_distribution()
        else "the keras.distribution you passed"
    )
    return StrategyChoice(
        name=type(requested).__name__,
        devices=names,
        replicas=_batch_replicas(requested, len(names)),
        reason=yours,
        instance=requested,
        scoped=False,
    )


def _sharded(hw: Hardware, requested: sharding.Sharded) -> StrategyChoice:
    """ModelParallel over the mesh that planning chose (`measure.jax.sharding`)."""
    batch, model = requested.mesh
    processes = hw.cluster.num_workers if _joined(hw) else 1
    local = devices(hw)
    return StrategyChoice(
        "model_parallel",
        local,
        batch,
        f"{batch * model} devices"
        + (f" of {processes} processes" if processes > 1 else "")
        + f" as a {batch} x {model} mesh: {requested.why}",
        scoped=False,
    )


def _joined(hw: Hardware) -> bool:
    return hw.cluster is not None and hw.cluster.source == jax_processes.JOINED


def _across_processes(hw: Hardware, local: tuple[str, ...]) -> StrategyChoice:
    """DataParallel over every joined process's devices."""
    processes = hw.cluster.num_workers
    kind = local[0].split(":")[0].upper()
    return StrategyChoice(
        "data_parallel",
        local,
        processes * len(local),
        f"{processes} JAX processes (jax.distributed) x {len(local)} {kind} "
        f"device{'s' if len(local) != 1 else ''}, this is process "
        f"{hw.cluster.task_index}: keras.distribution.DataParallel over all of "
        "them, each process reading its share of every global batch",
        scoped=False,
    )


def _batch_replicas(distribution: Any, devices: int) -> int:
    """How many ways `distribution` splits the batch: the size of its batch
    axis (all devices for `DataParallel`)."""
    mesh = getattr(distribution, "device_mesh", None)
    axis = getattr(distribution, "batch_dim_name", None)
    if mesh is None or axis is None:
        return max(1, devices)
    try:
        return int(mesh.shape[axis])
    except (KeyError, TypeError):
        return max(1, devices)
