"""The compiled search's answer confirmed by one real step, on a CPU.

XLA's memory analysis counts the buffers XLA assigns; on a CPU some work
takes memory outside them (a convolution's scratch: a small CNN's real step
took 1.21x the analysis's figure, an MLP's 1.0x). A real step there could
end the process (an out-of-memory on a CPU is the kernel's kill), so it runs
in a fresh child process (`step_child`), as the TensorFlow path's probes do:
it measures what the step really adds to resident memory, and `confirmed`
moves the search's answer by that ratio: down where it would not fit, up
where the step left room, as far as real steps show it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kerascale._keras_compat.serialization import tensorflow_left_unimported
from kerascale._units import format_bytes
from kerascale.measure.jax import step_child
from kerascale.sense.model_facts import gist

if TYPE_CHECKING:
    from kerascale.plan.plan import Plan


class Compiled(Protocol):
    """What a confirmation reads of one compile (`compiled.Compiled`): named
    here, not imported, so that the confirmation stands beside the compiled
    search rather than above it."""

    batch: int
    need_bytes: int


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
            with tensorflow_left_unimported():
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


# Real steps the confirmation may take (each a child process and a compile).
MAX_REAL_STEPS = 4


def confirmed(
    model: Any,
    element: Any,
    plan: Plan,
    chosen: int,
    seen: list[Compiled],
    limit: tuple[int, float, int],
    *,
    held_bytes: Callable[[int], int] | None = None,
) -> tuple[int, str]:
    """On a CPU: `chosen` checked by real steps in child processes
    (`real_need`), and moved by what each step really took, in proportion:
    down where it does not fit, up where it took at least `STEP_UP` less
    than there is room for, as far as real steps show room (XLA's count is
    not the truth here), each move checked by another real step, at most
    `MAX_REAL_STEPS`. Returns the largest batch a real step showed to fit
    (or, where none did, the last step down) and what the steps said.
    `limit`: (the bytes free, the margin kept below them, the cap).
    `held_bytes`: what this process holds beside the step at a global batch
    (the input's, a checkpoint's host copy).

    A proportional step is conservative both ways: a step's constant part
    makes it too small going down and short of the room going up. The first
    step down also aims `margin` below the room: a real step's figure varies
    (two steps of a CNN at one batch took 2% apart)."""
    free, margin, cap = limit
    room = free * (1 - margin)  # the margin against the real figure too
    best = max((c for c in seen if c.need_bytes <= free), key=lambda c: c.batch)
    predicted = best.need_bytes * chosen / best.batch
    said: list[str] = []
    fitted: int | None = None  # the largest batch a real step showed to fit
    failed: int | None = None  # the smallest it showed not to
    for attempt in range(MAX_REAL_STEPS):
        real, why = real_need(
            model,
            element,
            plan.precision,
            chosen,
            plan.replicas,
            getattr(plan, "recompute", ""),
        )
        if real is None:
            said.append(f"not confirmed by a real step: {why}")
            return fitted or chosen, "; ".join(["", *said])
        if held_bytes is not None:
            # The child's fit holds its own batches: what the input adds
            # beyond them (a pipeline's buffers) is this process's.
            real += max(0, held_bytes(0))
        said.append(
            f"a real step at {chosen} took {format_bytes(real)} "
            f"({real / max(1.0, predicted):.2f}x XLA's count)"
        )
        proportional = max(1, math.floor(chosen * room / real))
        if real <= room:
            fitted = chosen
            upper = min(cap, proportional, (failed or cap + 1) - 1)
            if upper < chosen * (1 + STEP_UP) or attempt == MAX_REAL_STEPS - 1:
                return chosen, "; ".join(["", *said])
            moved = f"stepped up to {upper}"
        else:
            failed = chosen
            if fitted is not None:
                upper = (fitted + chosen) // 2
                if upper <= fitted:
                    said[-1] += f": back to {fitted}"
                    return fitted, "; ".join(["", *said])
            else:
                # The real figure rules, and it is noisy: the first step down
                # aims a margin below the room, not at it.
                upper = max(1, math.floor(proportional * (1 - margin * (not attempt))))
            moved = f"stepped down to {upper}"
        said[-1] += f": {moved}"
        predicted, chosen = predicted * upper / chosen, upper
    return fitted or chosen, "; ".join(["", *said])
