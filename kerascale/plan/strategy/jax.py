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
from kerascale.plan import model_sharding as sharding
from kerascale.plan.choice import StrategyChoice
from kerascale.plan.reasons import Reason
from kerascale.sense import jax_processes
from kerascale.sense.cluster import check_trainable
from kerascale.sense.hardware import Hardware

CHOICES = ("auto", "default", "data_parallel")


def distribution_base() -> type:
    """Keras's `Distribution` base class, which Keras does not export: the
    common base of the two subclasses it does (DataParallel, ModelParallel).
    A class, not a method list: Keras 3.16 removed `distribute_dataset` from
    the base class (keras-team/keras#23046), which a duck-typed check read."""
    data, model = keras.distribution.DataParallel, keras.distribution.ModelParallel
    return next(c for c in data.__mro__[1:] if c in model.__mro__ and c is not object)


def is_distribution(value: Any) -> bool:
    """Whether `value` is a `keras.distribution` Distribution, a user's own
    subclass of the base included."""
    return isinstance(value, distribution_base())


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


def _shared_cpu_devices(hw: Hardware, local: tuple[str, ...]) -> Reason | None:
    """Why "auto" keeps one of several CPU devices of this process, or None:
    they share its cores, so a batch split over them computes no faster than
    on one, and adds an all-reduce (the step at N is N x one device's share,
    `plan.scaling`'s shared compute); XLA's CPU all-reduce over two devices
    on 2 cores also stalled and aborted a 1024-wide MLP's fit, where one
    device trains. Not where they stand in for accelerators (tests)."""
    if len(local) < 2 or hw.gpus or hw.tpu is not None or hw.cpu.devices_stand_in:
        return None
    return Reason("strategy.shared_cpu_devices", devices=len(local), cores=hw.cpu.cores)


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
    shared = _shared_cpu_devices(hw, local) if requested == "auto" else None
    if requested == "default" or (requested == "auto" and len(local) == 1) or shared:
        why = (
            "strategy.jax_default_asked"
            if requested == "default"
            else ("strategy.jax_one_device")
        )
        return StrategyChoice(
            "default",
            local[:1],
            1,
            shared or Reason(why),
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
        Reason("strategy.data_parallel_asked")
        if requested == "data_parallel"
        else Reason("strategy.data_parallel", devices=len(local), kind=kind)
    )
    return StrategyChoice(
        "data_parallel",
        local,
        len(local),
        why,
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
    yours = Reason(
        "strategy.distribution_set"
        if requested is global_distribution()
        else "strategy.distribution_passed"
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
    """ModelParallel over the mesh that planning chose (`measure.jax.replica_fit`)."""
    batch, model = requested.mesh
    processes = hw.cluster.num_workers if _joined(hw) else 1
    local = devices(hw)
    return StrategyChoice(
        "model_parallel",
        local,
        batch,
        Reason(
            "strategy.sharded",
            devices=batch * model,
            processes=processes,
            batch=batch,
            model=model,
            why=requested.why,
        ),
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
        Reason(
            "strategy.processes",
            processes=processes,
            devices=len(local),
            kind=kind,
            index=hw.cluster.task_index,
        ),
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
