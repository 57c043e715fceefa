"""The compiled search's answer confirmed by one real step, on a CPU.

XLA's memory analysis counts the buffers XLA assigns; on a CPU some work
takes memory outside them (a convolution's scratch: a small CNN's real step
took 1.21x the analysis's figure, an MLP's 1.0x). A real step there could
end the process (an out-of-memory on a CPU is the kernel's kill), so it runs
in a fresh child process (`step_child`), as the TensorFlow path's probes do:
it measures what the step really adds to resident memory, and the search
steps down by that ratio where the answer would not fit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from kerascale.measure.jax import step_child
from kerascale.sense.model_facts import gist

TIMEOUT_SECONDS = 600


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
