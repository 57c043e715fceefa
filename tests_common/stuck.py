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


def native_stacks(pid: int, depth: int = 14, timeout: float = 60) -> str:
    """Every thread of process `pid`, XLA's pool threads included (py-spy
    shows only the threads that run Python), one line each: its name and
    its innermost `depth` native frames, innermost first, as gdb reads them;
    or why there are none."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no native stacks: gdb is not installed)"
    try:
        done = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
             "-ex", f"thread apply all bt {depth}"],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"(no native stacks: gdb took over {timeout} s)"
    return condensed(done.stdout) or done.stderr[-2000:]


def condensed(backtraces: str) -> str:
    """gdb's `thread apply all bt` as one line a thread: `Thread N "name":
    f0 < f1 < ...` with each frame's function name only."""
    threads: list[str] = []
    for line in backtraces.splitlines():
        if line.startswith("Thread "):
            head = line.split(" (")[0]
            name = line.rsplit('"', 2)[1] if line.count('"') >= 2 else ""
            threads.append(f'{head} "{name}":')
        elif line.startswith("#") and threads:
            words = line.split()
            at = words.index("in") + 1 if "in" in words[:4] else 1
            function = words[at].split("(")[0] if at < len(words) else "?"
            threads[-1] += (" < " if threads[-1][-1] != ":" else " ") + function
    return "\n".join(threads)


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
        native = native_stacks(proc.pid)
        dump = stacks(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        raise Stuck(
            f"{command[1:3]} did not end in {timeout} s. Every thread, "
            f"innermost native frame first:\n{native}\n"
            f"--- its stderr's end:\n{err[-3000:]}\n"
            f"--- its Python threads:\n{dump}"
        ) from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
