"""Probe children forked from one process that imported TensorFlow once: a
child's start-up was 4 of its 5 s on 2 cores, mostly that import. CPU
probes only: nothing in the server has touched a device, and a GPU's driver
must not be initialised before a fork."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

# The server: imports what every probe child imports, then forks one child
# per request line (JSON: argv, RLIMIT_DATA, stderr's path), says its pid,
# reaps it and says how it ended. Each child runs in its own session, so
# that the caller can kill it and whatever it started as one group.
_SERVER = """\
import json, os, resource, sys
import numpy, tensorflow, keras
from kerascale.measure import child
from kerascale.measure.fork_server import present_file_pages, touch
pages = present_file_pages()
print("ready", flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            touch(pages)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            err = os.open(ask["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(null, 0); os.dup2(null, 1); os.dup2(err, 2)
            sys.stdin = open(os.devnull)
            sys.stdout = open(os.devnull, "w")
            sys.stderr = open(2, "w", closefd=False)
            if ask["rlimit"]:
                resource.setrlimit(resource.RLIMIT_DATA, (ask["rlimit"],) * 2)
            sys.argv = ["kerascale.measure.child", *ask["argv"]]
            code = child._child_main(ask["argv"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code or 0)
    print(f"pid {pid}", flush=True)
    _, status = os.waitpid(pid, 0)
    print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
os._exit(0)  # nothing to finalise: TensorFlow's took a second
"""


def present_file_pages() -> list[tuple[int, Any]]:
    """This process's pages of readable files (the libraries' code and
    data) that are mapped in now: (a mapping's start, the indices of its
    pages). From /proc/self/pagemap's present bit; none where it cannot be
    read. Devices are left out: reading their mappings may act on them."""
    import numpy as np

    found = []
    try:
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return found
    try:
        for line in maps:
            fields = line.split(None, 5)
            path = fields[5] if len(fields) == 6 else ""
            readable = fields[1].startswith("r")
            if not readable or not path.startswith("/") or path.startswith("/dev/"):
                continue
            start, end = (int(v, 16) for v in fields[0].split("-"))
            raw = os.pread(pagemap, ((end - start) >> 12) * 8, (start >> 12) * 8)
            present = np.nonzero(np.frombuffer(raw, np.uint64) >> np.uint64(63))[0]
            if present.size:
                found.append((start, present.astype(np.int64)))
    except OSError:
        return []
    finally:
        os.close(pagemap)
    return found


def touch(pages: list[tuple[int, Any]]) -> None:
    """Reads a byte of each page of `pages` (a forked child): a child maps
    its parent's file pages only as it touches them, so without this its
    baseline lacks what a fresh process's holds after the same imports, and
    the pages a step touches again count as the step's growth (15 MiB more
    for a small model)."""
    import ctypes

    import numpy as np

    for start, present in pages:
        mapped = (ctypes.c_uint8 * ((int(present[-1]) + 1) << 12)).from_address(start)
        np.frombuffer(mapped, np.uint8)[present << 12].sum()


READY_SECONDS = 120.0  # the server's imports, on a loaded machine


class ServerGone(Exception):
    """The server did not start, or ended: children start as processes of
    their own instead."""


class ForkServer:
    """One server per search (its environment and directory are the
    search's); `spawn` starts a child, `wait` gives its exit code as
    `Popen.returncode` would (negative: the signal that ended it)."""

    def __init__(self, env: dict[str, str], cwd: str):
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        self._pid: int | None = None
        self._buffer = b""
        try:
            self._expect("ready", READY_SECONDS)
        except ServerGone:
            self.close()
            raise

    def spawn(self, argv: list[str], rlimit: int, stderr_path: str) -> int:
        ask = {"argv": argv, "rlimit": rlimit, "stderr": stderr_path}
        try:
            self._proc.stdin.write((json.dumps(ask) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ServerGone(str(e)) from e
        self._pid = int(self._expect("pid ", 30.0))
        return self._pid

    def wait(self, timeout: float) -> int | None:
        """The child's exit code; None if it ran past `timeout` (it is then
        killed, with its group, and reaped)."""
        try:
            return int(self._expect("exit ", timeout))
        except TimeoutError:
            self._kill()
            # Its end is read here, or skipped by the next `spawn`'s read.
            with contextlib.suppress(TimeoutError):
                self._expect("exit ", 60.0)
            return None
        except ServerGone:
            self._kill()  # no one is left to reap it: it must not run on
            raise

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pid, signal.SIGKILL)

    def close(self) -> None:
        proc = self._proc
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(OSError):
            proc.stdout.close()

    def _expect(self, prefix: str, timeout: float) -> str:
        """The rest of the server's next line, which starts with `prefix`
        (read from its pipe as it comes: a line may wait in the buffer)."""
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if newline:
                self._buffer = rest
                text = line.decode("utf-8", "replace")
                if text.startswith(prefix):
                    return text[len(prefix) :].strip()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                if prefix == "ready":
                    raise ServerGone("it did not start in time")
                raise TimeoutError(prefix)
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise ServerGone(f"it ended ({self._proc.poll()})")
                self._buffer += chunk
