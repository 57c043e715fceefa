"""Which dtype policy is faster on this hardware. Pure.

Applying a policy (re-creating the model under it) is
`kerascale.apply.model`'s job.
"""

from __future__ import annotations

from kerascale.plan.reasons import Reason
from kerascale.sense import backend as backend_lib
from kerascale.sense.hardware import Hardware

CHOICES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def choose(
    hw: Hardware, requested: str, *, model_policy: str = "float32"
) -> tuple[str, Reason, tuple[str, ...]]:
    """Picks the dtype policy. Pure.

    Args:
        hw: The hardware.
        requested: "auto" or a policy name from `CHOICES`.
        model_policy: The model's current policy; "auto" keeps a mixed policy
            the user already chose.

    Returns:
        (policy name, reason, warnings).
    """
    if requested != "auto":
        return requested, Reason("precision.asked"), _explicit_warnings(hw, requested)
    if model_policy != "float32":
        return model_policy, Reason("precision.model", policy=model_policy), ()
    if hw.tpu is not None:
        return "mixed_bfloat16", Reason("precision.tpu"), ()
    if hw.gpus:
        cc = hw.min_compute_capability
        if cc is None:
            return "float32", Reason("precision.gpu_unknown"), ()
        gpu = {"spelled": "{}.{}".format(*cc), "lowest": not hw.gpus_homogeneous}
        if cc >= (8, 0):
            return "mixed_bfloat16", Reason("precision.gpu_bf16", **gpu), ()
        if cc >= (7, 0):
            return "mixed_float16", Reason("precision.gpu_fp16", **gpu), ()
        return "float32", Reason("precision.gpu_old", **gpu), ()
    if trial_candidate(hw):
        why = backend_lib.traits(hw.backend).bf16_cpu_why
        return "float32", Reason("precision.cpu_by_trial", why=why), ()
    if hw.cpu.bf16:
        flags = ", ".join(hw.cpu.bf16_flags)
        return "mixed_bfloat16", Reason("precision.cpu_bf16", flags=flags), ()
    return "float32", Reason("precision.cpu_no_bf16"), ()


def trial_candidate(hw: Hardware) -> str:
    """The policy that CPU trials time against the rule's float32, where
    the rule keeps float32 only by a measurement on other models: bf16 on a
    CPU with bf16 math, where it was as often slower as faster
    (`Traits.bf16_cpu_why`). "" elsewhere (the rule's own choice is the
    candidate)."""
    by_trial = backend_lib.traits(hw.backend).bf16_cpu_by_trial
    on_cpu = hw.accelerator == "cpu" and hw.cpu.bf16
    return "mixed_bfloat16" if by_trial and on_cpu else ""


def _explicit_warnings(hw: Hardware, policy: str) -> tuple[str, ...]:
    on = hw.accelerator
    if policy == "mixed_float16" and on == "cpu":
        return (
            "mixed_float16 on CPU is emulated: several times slower than float32. "
            'Use precision="auto".',
        )
    if policy == "mixed_float16" and on == "tpu":
        return ("TPUs do not support float16 well; mixed_bfloat16 is native.",)
    if policy == "mixed_bfloat16" and on == "cpu" and not hw.cpu.bf16:
        return ("This CPU has no native bf16: mixed_bfloat16 will be slower.",)
    if policy == "mixed_bfloat16" and on == "gpu":
        cc = hw.min_compute_capability
        if cc is not None and cc < (8, 0):
            return (
                "bf16 needs compute capability >= 8.0; this GPU has "
                "{}.{}: mixed_bfloat16 will be slow.".format(*cc),
            )
    return ()
