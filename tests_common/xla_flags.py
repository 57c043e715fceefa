"""XLA_FLAGS for the tests' JAX processes.

XLA's CPU runtime (jax 0.10.2) aborts the process when a participant of an
in-process collective has not joined it within 40 s
(`xla_cpu_collective_call_terminate_timeout_seconds`). The tests wait 300 s
instead, so that a starved device's thread on a loaded 2-core runner is not
taken for a hang; a collective that never completes still fails, later, and
its child's stacks are dumped (tests_common/stuck.py; the known flake,
CONTRIBUTING.md).
"""

import os

PATIENT = "--xla_cpu_collective_call_terminate_timeout_seconds=300"


def forced_devices(n: int) -> str:
    """The flags for `n` forced host devices, with the tests' patience."""
    return f"--xla_force_host_platform_device_count={n} {PATIENT}"


def patient() -> str:
    """This process's XLA_FLAGS with the tests' patience, for a conftest to
    set before JAX starts (the children it starts inherit them)."""
    flags = os.environ.get("XLA_FLAGS", "")
    return flags if PATIENT in flags else f"{flags} {PATIENT}".strip()
