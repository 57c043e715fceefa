"""Which dtype policy is faster on this hardware. Pure.

Applying a policy (re-creating the model under it) is
`kerascale.apply.model`'s job.
"""

from __future__ import annotations

from kerascale.sense import backend as backend_lib
from kerascale.sense.hardware import Hardware

CHOICES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def choose(
    hw: Hardware, requested: str, *, model_policy: str = "float32"
) -> tuple[str, str, tuple[str, ...]]:
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
        return requested, "you asked for it", _explicit_warnings(hw, requested)
    if model_policy != "float32":
        return model_policy, f"your model already uses {model_policy}", ()
    if hw.tpu is not None:
        return "mixed_bfloat16", "TPU: bfloat16 is native on TPUs", ()
    if hw.gpus:
        cc = hw.min_compute_capability
        if cc is None:
            return "float32", "GPU compute capability unknown: float32 is safe", ()
        spelled = "{}.{}".format(*cc)
        lowest = " (lowest across GPUs)" if not hw.gpus_homogeneous else ""
        if cc >= (8, 0):
            return (
                "mixed_bfloat16",
                f"GPU compute capability {spelled}{lowest} >= 8.0: bf16 tensor "
                "cores, and no loss scaling needed",
                (),
            )
        if cc >= (7, 0):
            return (
                "mixed_float16",
                f"GPU compute capability {spelled}{lowest}: float16 tensor cores, "
                "with dynamic loss scaling",
                (),
            )
        return (
            "float32",
            f"GPU compute capability {spelled}{lowest} < 7.0: no tensor cores",
            (),
        )
    if trial_candidate(hw):
        return (
            "float32",
            "JAX on CPU: XLA's CPU code runs bf16 no faster than float32 (a CNN "
            "0.96x, an MLP 0.74x on an AVX512_BF16 CPU), unless the trials time "
            "your model faster in mixed_bfloat16; "
            "pass precision='mixed_bfloat16' to use it anyway",
            (),
        )
    if hw.cpu.bf16:
        return (
            "mixed_bfloat16",
            f"CPU has native bf16 ({', '.join(hw.cpu.bf16_flags)}): bf16 math "
            "steps faster than float32",
            (),
        )
    return "float32", "CPU without native bf16: mixed precision would be slower", ()


def trial_candidate(hw: Hardware) -> str:
    """The policy that CPU trials time against the rule's float32, where
    the rule keeps float32 only by a measurement on other models: bf16 on a
    CPU with bf16 math under JAX, whose CPU compiler often gains nothing from
    it. "" elsewhere (the rule's own choice is the candidate)."""
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
