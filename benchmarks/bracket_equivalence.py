"""One bracket for both engines, checked against the two it replaced (issue 57).

Until 6f9e910, TensorFlow's search (`measure/search.py:_Search.largest`) and
JAX's (`measure/jax/compiled.py:search`) were two bracket algorithms. Now
both run `search.Bracket.largest`, each with its guide (`MemoryModelGuide`,
`compiled.Secant`). This runs the old modules (read from git at that commit)
and the new ones on the same deterministic seams and counts the cases whose
probe sequence or answer differs: every batch probed, in order, and the
batch found.

    .venv/bin/python benchmarks/bracket_equivalence.py [--cases 300]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _results import write

from kerascale.measure import search as new_search
from kerascale.measure.jax import compiled as new_compiled
from kerascale.measure.result import ProbeResult

BEFORE = "6f9e910"
ROOT = Path(__file__).resolve().parent.parent


def old_module(path: str, name: str, fix=lambda s: s):
    text = subprocess.run(
        ["git", "show", f"{BEFORE}:{path}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(fix(text))
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tensorflow_cases(old, cases: int) -> tuple[int, int]:
    """TensorFlow's search on a noisy linear seam: every threshold to 79 and
    `cases` random ones, over granules, limits, margins, modes, first
    batches and caps."""
    fixed, per = 50e6, 1e5
    rng = random.Random(0)
    thresholds = list(range(1, 80)) + [rng.randint(1, 70000) for _ in range(cases)]
    n = differ = 0
    for t in thresholds:
        grid = itertools.product(
            (1, 8),
            (None, 1.0, 1.3, 0.7),
            (0, 0.03, 0.1),
            # "ladder" (the CPU trials' rungs) is gone from both engines
            # (issue 82): the run chooses on a CPU.
            ("max", "throughput"),
            (None, 100, 5000),
            (1 << 16, 3000, 50),
        )
        for g, over, margin, mode, first, cap in grid:
            limit = None if over is None else fixed + per * t * over
            runs = []
            for module in (old, new_search):
                noise = random.Random(t)
                calls: list[int] = []

                def probe(b, calls=calls, noise=noise, t=t):
                    calls.append(b)
                    peak = fixed + per * b * (1 + 0.02 * noise.random())
                    fits = b <= t
                    return ProbeResult(
                        b,
                        "ok" if fits else "oom",
                        peak_bytes=int(peak) if fits else None,
                        samples_per_s=1000 * b / (b + 200),
                    )

                try:
                    r = module.search(
                        probe,
                        cap=cap,
                        limit_bytes=limit,
                        granularity=g,
                        margin=margin,
                        mode=mode,
                        first=first,
                    )
                    out = (r.batch_size, r.largest_fitting, r.smallest_failing)
                except Exception as e:  # the same error is the same answer
                    out = type(e).__name__
                runs.append((calls, out))
            n += 1
            differ += runs[0] != runs[1]
    return n, differ


def jax_cases(old, cases: int) -> tuple[int, int]:
    """JAX's compiled search on random linear and curved need figures."""
    rng = random.Random(0)
    n = differ = 0
    for _ in range(cases):
        fixed, per = rng.uniform(0, 1e9), rng.uniform(1e3, 1e7)
        curve, free = rng.choice([0, 0.3, -0.3, 0.1]), rng.uniform(0, 5e9)
        start = rng.choice([1, 8, 32, 64, 500])
        cap = rng.choice([10, 100, 1000, 65536, 1 << 20])
        most, measured_first = rng.choice([3, 5, 8]), rng.random() < 0.5
        runs = []
        for module in (old, new_compiled):
            calls: list[int] = []

            def need(b, module=module, calls=calls, figure=(fixed, per, curve)):
                calls.append(b)
                at_zero, slope, bend = figure
                bytes_ = at_zero + slope * b * (1 + bend * math.log1p(b) / 10)
                return module.Compiled(b, int(bytes_), 0.0)

            measured = (need(max(1, min(start, cap))),) if measured_first else ()
            found = module.search(
                need, free, start=start, cap=cap, max_compiles=most, measured=measured
            )
            runs.append((calls, found.fits, found.fails))
        n += 1
        differ += runs[0] != runs[1]
    return n, differ


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=300)
    args = parser.parse_args()
    old_search = old_module(
        "kerascale/measure/search.py",
        "old_search",
        lambda s: s.replace(
            "kerascale.measure.probe import", "kerascale.measure.result import"
        ).replace(
            "kerascale.measure.memory_model import", "kerascale.measure.result import"
        ),
    )
    old_compiled = old_module("kerascale/measure/jax/compiled.py", "old_compiled")
    tf_n, tf_differ = tensorflow_cases(old_search, args.cases)
    jax_n, jax_differ = jax_cases(old_compiled, 20000 * args.cases // 300)
    print("| engine | cases | differ |\n|---|---|---|")
    print(f"| TensorFlow (memory model) | {tf_n} | {tf_differ} |")
    print(f"| JAX (secant) | {jax_n} | {jax_differ} |")
    write(
        "bracket_equivalence",
        before=BEFORE,
        tensorflow=[tf_n, tf_differ],
        jax=[jax_n, jax_differ],
    )
    if tf_differ or jax_differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
