"""Loaded by every Python process started with this folder first on
PYTHONPATH (`benchmarks/suite_cpu.py` puts it there): a process that a test
started (it inherits pytest's PYTEST_CURRENT_TEST) appends, at its exit, the
test's id, its own CPU seconds, its reaped children's, its wall seconds and
its command to the file SUITE_CPU_LOG names. A process killed by a signal,
or a fork that leaves by `os._exit`, writes nothing."""

import atexit
import os
import resource
import sys
import time

_STARTED = time.time()
_TEST = os.environ.get("PYTEST_CURRENT_TEST")
_LOG = os.environ.get("SUITE_CPU_LOG")

if _TEST and _LOG:

    def _write() -> None:
        own = resource.getrusage(resource.RUSAGE_SELF)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        row = (
            _TEST.split(" ")[0],
            f"{own.ru_utime + own.ru_stime:.2f}",
            f"{reaped.ru_utime + reaped.ru_stime:.2f}",
            f"{time.time() - _STARTED:.2f}",
            " ".join(sys.argv[:2])[:120].replace("\t", " "),
        )
        try:
            with open(_LOG, "a") as f:
                f.write("\t".join(row) + "\n")
        except OSError:
            pass

    atexit.register(_write)
