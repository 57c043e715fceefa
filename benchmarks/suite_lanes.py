"""The test suite's time, lane by lane, and the share of the cores each kept busy.

Runs README's test command (the last line of .ci/run) in a checkout, or the
command given, reads nox's "Running session" lines as they come and samples
/proc/stat every second, then prints each lane's seconds and CPU share
(busy jiffies over all jiffies while it ran). Linux only.

    git clone . /tmp/fresh && python3 benchmarks/suite_lanes.py --checkout /tmp/fresh
    python3 benchmarks/suite_lanes.py -- .venv-nox/bin/nox -s jax jax_2dev
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

SESSION = re.compile(r"nox > Running session (\S+)")


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=Path.cwd())
    parser.add_argument("--log", type=Path, help="also write the command's output here")
    parser.add_argument("command", nargs="*", help="default: .ci/run's last line")
    args = parser.parse_args()
    command = args.command or [
        "bash", "-c", (args.checkout / ".ci/run").read_text().strip().splitlines()[-1]
    ]  # fmt: skip
    marks: list[tuple[float, str, tuple[int, int]]] = []
    start = time.monotonic()
    marks.append((start, "(before the first lane)", cpu_jiffies()))
    proc = subprocess.Popen(
        command,
        cwd=args.checkout,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    log = args.log.open("w") if args.log else None

    def read() -> None:
        for line in proc.stdout:
            if log:
                log.write(line)
            found = SESSION.search(line)
            if found:
                marks.append((time.monotonic(), found.group(1), cpu_jiffies()))
                took = time.monotonic() - start
                print(f"{took:7.0f} s  {found.group(1)}", flush=True)

    reader = threading.Thread(target=read)
    reader.start()
    code = proc.wait()
    reader.join()
    marks.append((time.monotonic(), "(end)", cpu_jiffies()))
    print(f"\n{'lane':26s} {'seconds':>8s} {'CPU':>6s}")
    for (t0, name, (b0, a0)), (t1, _, (b1, a1)) in itertools.pairwise(marks):
        share = 100 * (b1 - b0) / max(a1 - a0, 1)
        print(f"{name:26s} {t1 - t0:8.0f} {share:5.0f}%")
    print(f"{'total':26s} {marks[-1][0] - start:8.0f}   (exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
