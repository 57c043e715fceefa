"""Which `tf.distribute` strategy to train under, on the TensorFlow backend.
Pure.

TPU -> TPUStrategy; several GPUs -> Mirrored; one GPU or a CPU -> the default
strategy (one replica needs no scope, so the model trains as it is); a
cluster of two or more workers -> MultiWorkerMirrored.
Building the strategy object is `kerascale.apply.strategy`'s job.
"""

from __future__ import annotations

from typing import Any

from kerascale import _tf, _validation
from kerascale.errors import ConfigurationError
from kerascale.plan.choice import StrategyChoice
from kerascale.plan.reasons import Reason
from kerascale.sense.cluster import check_trainable
from kerascale.sense.hardware import Hardware

CHOICES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")


def _is_strategy_instance(value: Any) -> bool:
    return _tf.is_instance(value, "distribute", "Strategy")


def validate_request(strategy: Any) -> None:
    """Accepts a name from `CHOICES` or a `tf.distribute.Strategy` instance."""
    if _is_strategy_instance(strategy):
        return
    if not isinstance(strategy, str) or strategy not in CHOICES:
        names = ", ".join(repr(c) for c in CHOICES)
        raise _validation.fail(
            "strategy", strategy, f"one of {names}, or a tf.distribute.Strategy"
        )


def _accelerator_devices(hw: Hardware) -> tuple[str, ...]:
    if hw.gpus:
        return tuple(f"/gpu:{g.index}" for g in hw.gpus)
    return tuple(f"/cpu:{i}" for i in range(max(1, hw.cpu.logical_devices)))


def choose(hw: Hardware, requested: Any) -> StrategyChoice:
    """Picks the strategy for `requested` ("auto", a name, or an instance).

    Raises:
        ClusterConfigError: If the environment describes a malformed cluster.
        UnsupportedError: For a cluster task that does not train (a
            parameter server or an evaluator).
        ConfigurationError: If a named strategy cannot run here (e.g. "tpu"
            without a TPU).
    """
    if _is_strategy_instance(requested):
        name = type(requested).__name__
        devices = tuple(getattr(requested.extended, "worker_devices", ()) or ())
        return StrategyChoice(
            name=name,
            devices=devices,
            replicas=int(requested.num_replicas_in_sync),
            reason=Reason("strategy.instance"),
            instance=requested,
        )

    if wants_cluster(hw, requested):
        return _multi_worker_choice(hw, requested)
    if requested == "multi_worker":
        raise ConfigurationError(
            'strategy="multi_worker" needs a cluster of two or more workers, and '
            "none is described here: set TF_CONFIG (or run under SLURM's srun or "
            'Vertex AI), or use "auto" to train on this machine. Received: '
            "strategy='multi_worker'"
        )

    if requested == "auto":
        return _choose_auto(hw)
    if requested == "tpu":
        if hw.tpu is None:
            raise ConfigurationError(
                'strategy="tpu" needs a TPU, and none was found (no TPU_NAME, '
                'COLAB_TPU_ADDR or /dev/accel*). Use "auto" to pick what is '
                "here. Received: strategy='tpu'"
            )
        return _tpu_choice(hw, Reason("strategy.tpu_asked"))
    if requested == "default":
        device = "/gpu:0" if hw.gpus else "/cpu:0"
        return StrategyChoice("default", (device,), 1, Reason("strategy.asked"))
    if requested == "one_device":
        device = "/gpu:0" if hw.gpus else "/cpu:0"
        return StrategyChoice("one_device", (device,), 1, Reason("strategy.asked"))
    # "mirrored"
    devices = _accelerator_devices(hw)
    warnings = []
    if len(devices) == 1:
        warnings.append(
            "strategy='mirrored' with a single device trains one replica: no "
            "speed-up over 'one_device'."
        )
    warnings += _mixed_gpu_warning(hw)
    return StrategyChoice(
        "mirrored", devices, len(devices), Reason("strategy.asked"), tuple(warnings)
    )


def wants_cluster(hw: Hardware, requested: Any) -> bool:
    """Whether `requested` trains across the cluster the environment
    describes: "auto" or "multi_worker" with two or more workers (or a
    malformed description, which must be reported rather than ignored)."""
    cluster = hw.cluster
    if requested not in ("auto", "multi_worker") or cluster is None:
        return False
    return cluster.error is not None or cluster.is_multi_worker


def _multi_worker_choice(hw: Hardware, requested: str) -> StrategyChoice:
    cluster = hw.cluster
    check_trainable(cluster)
    local = local_devices(hw)
    where = f"{cluster.task_type} {cluster.task_index}" if cluster.task_type else ""
    reason = Reason(
        "strategy.multi_worker",
        source=cluster.source,
        workers=cluster.num_workers,
        devices=len(local),
        where=where,
        asked=requested != "auto",
    )
    return StrategyChoice(
        "multi_worker",
        local,
        cluster.num_workers * len(local),
        reason,
        _mixed_gpu_warning(hw),
    )


def local_devices(hw: Hardware) -> tuple[str, ...]:
    """The devices one worker of MultiWorkerMirroredStrategy trains on: all
    its GPUs, else its first CPU."""
    if hw.gpus:
        return tuple(f"/gpu:{g.index}" for g in hw.gpus)
    return ("/cpu:0",)


def local_equivalent(name: str, devices: tuple[str, ...]) -> str:
    """The single-machine strategy that puts one worker's share of a
    multi-worker plan on the same devices (for probes and trials, which run
    on each machine alone)."""
    if name != "multi_worker":
        return name
    if len(devices) > 1:
        return "mirrored"
    return "one_device" if devices and devices[0].startswith("/gpu") else "default"


def _tpu_choice(hw: Hardware, reason: Reason) -> StrategyChoice:
    # The core count is only known once the TPU system is initialised, which
    # takes a network round trip; 8 (a v2-8/v3-8/v5e-8 host) stands in until
    # then, and `fit` re-plans with the real count after `build`.
    return StrategyChoice("tpu", (hw.tpu.name,), 8, reason)


def _mixed_gpu_warning(hw: Hardware) -> tuple[str, ...]:
    if hw.gpus_homogeneous:
        return ()
    names = ", ".join(sorted({g.name for g in hw.gpus}))
    return (
        f"GPUs of different types ({names}): replicas step in lock-step, so the "
        "slowest card sets the pace. Hide the slow ones with "
        "CUDA_VISIBLE_DEVICES if that is faster.",
    )


def _choose_auto(hw: Hardware) -> StrategyChoice:
    if hw.tpu is not None:
        return _tpu_choice(hw, Reason("strategy.tpu_found", source=hw.tpu.source))
    if len(hw.gpus) > 1:
        reason = Reason("strategy.gpus", n=len(hw.gpus), mixed=not hw.gpus_homogeneous)
        devices = _accelerator_devices(hw)
        return StrategyChoice(
            "mirrored", devices, len(devices), reason, _mixed_gpu_warning(hw)
        )
    if len(hw.gpus) == 1:
        # One replica needs no strategy scope: TensorFlow places the model on
        # the GPU, and the model trains as it is (no copy of its variables).
        return StrategyChoice("default", ("/gpu:0",), 1, Reason("strategy.one_gpu"))
    return StrategyChoice("default", ("/cpu:0",), 1, Reason("strategy.cpu_only"))
