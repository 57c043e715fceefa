"""A test's child that does not end in time is dumped before it is killed.

Its threads' Python and native stacks (py-spy, a test dependency) go into the
failure's message, so that a hang says where it waits: which threads, in
which of XLA's or kerascale's functions. Written for the 2-device JAX flake
(issue 77: a child that never finished an all-reduce's rendezvous, reported
with no stack). Imports nothing but the standard library.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def py_spy() -> str | None:
    """py-spy beside this interpreter, or on PATH; None where neither is."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def stacks(pid: int, timeout: float = 60) -> str:
    """Every thread's stack of process `pid`, native frames included, as
    py-spy prints them; or why there are none."""
    tool = py_spy()
    if tool is None:
        return "(no stacks: py-spy is not installed)"
    try:
        done = subprocess.run(
            [tool, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"(no stacks: py-spy took over {timeout} s)"
    return done.stdout + done.stderr


class Stuck(AssertionError):
    """A child did not end within its time; the message holds its stacks."""


def run(command: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, ...)`; a
    child still running after `timeout` seconds is dumped, killed, and
    raises `Stuck` with its stacks and the end of what it wrote."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        dump = stacks(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        raise Stuck(
            f"{command[1:3]} did not end in {timeout} s. Its threads:\n{dump}\n"
            f"--- its stderr's end:\n{err[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
