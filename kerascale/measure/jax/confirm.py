"""The compiled search's answer confirmed by one real step, on a CPU.

XLA's memory analysis counts the buffers XLA assigns; on a CPU some work
takes memory outside them (a convolution's scratch: a small CNN's real step
took 1.21x the analysis's figure, an MLP's 1.0x). A real step there could
end the process (an out-of-memory on a CPU is the kernel's kill), so it runs
in a fresh child process (`step_child`), as the TensorFlow path's probes do:
it measures what the step really adds to resident memory, and `confirmed`
moves the search's answer by that ratio: down where it would not fit, up
(within XLA's bracket) where the step left room.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from kerascale._units import format_bytes
from kerascale.measure.jax import step_child
from kerascale.sense.model_facts import gist

if TYPE_CHECKING:
    from kerascale.measure.jax.compiled import Compiled

TIMEOUT_SECONDS = 600
# On a CPU, the confirming real step moves the answer up (within XLA's
# bracket) only where it has room for at least this much more: XLA's count
# can exceed what a step really takes (an MLP in bf16 on a CPU without
# AVX-512), and the 3% margin then lands below 0.9 of the truth.
STEP_UP = 0.05


def real_need(
    model: Any,
    element: Any,
    policy: str,
    batch: int,
    replicas: int = 1,
    recompute: str = "",
) -> tuple[int | None, str]:
    """(the bytes one real step at per-replica `batch` adds to a fresh
    process's resident memory, or None where it cannot be measured; why
    not). With `replicas` > 1 the child makes that many CPU devices and
    trains under `keras.distribution.DataParallel` over them, as `fit` does:
    every replica's buffers are in its memory. `recompute`: the plan's
    remat mode, set on the child's model too."""
    with tempfile.TemporaryDirectory(prefix="kerascale-step-") as directory:
        path = os.path.join(directory, "model.keras")
        spec = os.path.join(directory, "spec.json")
        try:
            model.save(path)
        except Exception as e:
            return None, f"the model cannot be saved for a child ({gist(e)})"
        with open(spec, "w", encoding="utf-8") as f:
            json.dump(step_child.encode_spec(element), f)
        devices = f"--xla_force_host_platform_device_count={replicas}"
        env = {
            **os.environ,
            "KERAS_BACKEND": "jax",
            "XLA_FLAGS": devices if replicas > 1 else "",
        }
        command = [sys.executable, "-m", "kerascale.measure.jax.step_child"]
        try:
            done = subprocess.run(
                [*command, path, spec, policy, str(batch), str(replicas), recompute],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return None, f"the child's step took over {TIMEOUT_SECONDS}s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"the child's step failed ({last[:200]})"
    return int(json.loads(done.stdout.strip().splitlines()[-1])["need"]), ""


def confirmed(
    model: Any,
    element: Any,
    plan: Any,
    chosen: int,
    seen: list[Compiled],
    limit: tuple[int, float, int],
) -> tuple[int, str]:
    """On a CPU: `chosen` checked by a real step in a child process
    (`real_need`), and moved by what the step really took, in proportion: down
    where it would not fit (once more checked), up where it took at least
    `STEP_UP` less than there is room for (checked too, and given up for
    `chosen` where it does not fit); the batch and what the checks said.
    `limit`: (the bytes free, the margin kept below them, the largest batch
    it may step up to: below the smallest that XLA's count showed not to
    fit, or the cap).

    A proportional step is conservative both ways: a step's constant part
    makes it too small going down and short of the room going up. The first
    step down also aims `margin` below the room: the step that showed XLA's
    count short is the only figure there is, and it varies."""
    free, margin, ceiling = limit
    room = free * (1 - margin)  # the margin against the real figure too
    best = max((c for c in seen if c.need_bytes <= free), key=lambda c: c.batch)
    predicted = best.need_bytes * chosen / best.batch
    said: list[str] = []
    fitted = None  # the largest batch a real step showed to fit
    for attempt in range(2):
        real, why = real_need(
            model, element, plan.precision, chosen, plan.replicas,
            getattr(plan, "recompute", ""),
        )  # fmt: skip
        if real is None:
            said.append(f"not confirmed by a real step: {why}")
            return fitted or chosen, "; ".join(["", *said])
        said.append(
            f"a real step at {chosen} took {format_bytes(real)} "
            f"({real / max(1.0, predicted):.2f}x XLA's count)"
        )
        proportional = max(1, math.floor(chosen * room / real))
        if real > room and fitted is not None:
            said[-1] += f": back to {fitted}"
            return fitted, "; ".join(["", *said])
        if real <= room:
            upper = min(ceiling, proportional)
            if attempt or upper < chosen * (1 + STEP_UP):
                return chosen, "; ".join(["", *said])
            fitted, moved = chosen, f"stepped up to {upper}"
        else:
            # XLA's count fell short: the real figure rules, and it is noisy
            # (two steps of a CNN at one batch took 2% apart), so the first
            # step down aims a margin below the room, not at it; a second
            # (the first's step over the room, by the noise) aims at it.
            upper = max(1, math.floor(proportional * (1 - margin * (not attempt))))
            moved = f"stepped down to {upper}"
        said[-1] += f": {moved}"
        predicted, chosen = predicted * upper / chosen, upper
    return chosen, "; ".join(["", *said])
