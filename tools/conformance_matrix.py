"""The whole conformance matrix, outside CI: runs every cell on every
backend and device count (one child process each) and prints the table.

    python tools/conformance_matrix.py [--pairwise]

Needs `.venv` (TensorFlow, and JAX beside it) and `.venv-jax` (JAX alone),
as README's test command makes them. CI runs the pairwise cover of the same
cells (tests/test_conformance.py, tests_jax/test_conformance.py).
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests_common" / "conformance.py"
RUNS = (  # (python, KERAS_BACKEND, devices)
    (".venv", "tensorflow", 1),
    (".venv", "tensorflow", 2),
    (".venv", "jax", 1),
    (".venv", "jax", 2),
    (".venv-jax", "jax", 1),
    (".venv-jax", "jax", 2),
)


def main() -> int:
    failed, header = 0, True
    for venv, backend, devices in RUNS:
        env = dict(
            os.environ,
            KERAS_BACKEND=backend,
            KERASCALE_TEST_DEVICES=str(devices),
            TF_CPP_MIN_LOG_LEVEL="3",
            # Patient collectives: tests_common/xla_flags.py says why.
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
            "--xla_cpu_collective_call_terminate_timeout_seconds=300",
        )
        python = ROOT / venv / "bin" / "python"
        proc = subprocess.run(
            [str(python), "-W", "ignore", str(SCRIPT), *sys.argv[1:]],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        rows = [line for line in proc.stdout.splitlines() if line.startswith("|")]
        print("\n".join(rows if header else rows[2:]), flush=True)
        header = header and not rows
        failed += proc.returncode != 0
        if proc.returncode and not rows[2:]:
            print(proc.stderr[-3000:], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
