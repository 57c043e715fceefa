"""Where the suite's CPU goes: the CPU seconds of the processes each test
starts, by test (issue 56: the suite is bound by its 2 cores, not by waiting,
so its time is cut where its CPU goes).

    .venv/bin/python benchmarks/suite_cpu.py -- -m "not serial and not cluster" \
        -n 2 --dist loadfile
    .venv-jax/bin/python benchmarks/suite_cpu.py -- tests_jax -n 2 --dist load

Runs pytest with the arguments after `--`, with `suite_cpu/` first on
PYTHONPATH (its sitecustomize logs each process a test starts), then prints
the tests whose processes took most CPU, with how many processes each
started. The test processes themselves (pytest's workers) are not counted:
`--durations=0` gives their share.
"""

from __future__ import annotations

import collections
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    args = argv[argv.index("--") + 1 :] if "--" in argv else argv
    with tempfile.TemporaryDirectory(prefix="kerascale-suite-cpu-") as tmp:
        log = pathlib.Path(tmp, "log.tsv")
        paths = [str(HERE / "suite_cpu"), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "SUITE_CPU_LOG": str(log),
            "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        }
        code = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
        rows = log.read_text().splitlines() if log.exists() else []
    seconds: collections.Counter[str] = collections.Counter()
    started: collections.Counter[str] = collections.Counter()
    for row in rows:
        test, own, reaped, _wall, _command = row.split("\t")
        seconds[test] += float(own) + float(reaped)
        started[test] += 1
    total = sum(seconds.values())
    print(f"\n{len(rows)} processes started by tests, {total:.0f} CPU seconds in all")
    for test, cpu in seconds.most_common(30):
        print(f"{cpu:7.1f} s  {started[test]:3d}  {test}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
