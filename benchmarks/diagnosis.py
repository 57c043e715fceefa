"""Diagnosis and monitoring: the three verdicts with their numbers, the
speed-up of `kerascale.data.optimize` on an input-bound pipeline, and the overhead of
the Throughput and GPUMonitor callbacks on step time.

    python benchmarks/diagnosis.py [--rounds 7]

1. `kerascale.diagnose` on the workloads of tests/test_diagnosis.py: a slow
   Python map (input), a convnet on cached data (compute), and a batch near a
   real 830 MiB memory limit (memory).
2. Training throughput (`model.fit`, 40 steps after warm-up) on the slow-map
   pipeline as written and after `kerascale.data.optimize`, alternating.
3. The quickstart CNN's step time with and without Throughput + GPUMonitor
   (NVML faked here: a module answering instantly, sampled every 0.1 s, so
   the figure is the callbacks' own cost): batch 256, 200 timed steps per
   measurement, alternating which runs first.

Writes benchmarks/results/diagnosis.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

import kerascale
from kerascale.callbacks import GPUMonitor, Throughput

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

from quickstart import make_data, make_model  # noqa: E402
from test_diagnosis import (  # noqa: E402
    compute_bound_workload,
    input_bound_data,
    small_model,
)
from test_diagnosis_memory import (  # noqa: E402
    memory_bound_limit,
    memory_bound_workload,
)


def verdicts() -> dict:
    out = {}
    d = kerascale.diagnose(
        small_model(),
        input_bound_data().batch(32),
        optimize_data=False,
        precision="float32",
        steps=20,
        verbose=0,
    )
    out["input"] = d
    model, ds = compute_bound_workload()
    out["compute"] = kerascale.diagnose(
        model, ds, precision="float32", optimize_data=False, steps=10, verbose=0
    )
    model, ds = memory_bound_workload()
    out["memory"] = kerascale.diagnose(
        model,
        ds,
        steps=3,
        verbose=0,
        batch_size=2048,
        memory_limit=memory_bound_limit(model),
        precision="float32",
    )
    return {k: v.to_dict() for k, v in out.items()}


class _Clock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def train_rate(model, ds, steps=40, warmup=5, callbacks=()):
    clock = _Clock()
    model.fit(
        ds.repeat(),
        epochs=1,
        steps_per_epoch=warmup + steps,
        verbose=0,
        shuffle=False,
        callbacks=[clock, *callbacks],
    )
    timed = clock.ends[warmup - 1 :]
    return (len(timed) - 1) / (timed[-1] - timed[0])


def optimize_speedup(rounds: int) -> dict:
    plain = input_bound_data().batch(32)
    fast = kerascale.data.optimize(input_bound_data()).batch(32)
    model = small_model()
    ratios, rates = [], {"plain": [], "optimized": []}
    for _ in range(rounds):
        a = train_rate(model, plain)
        b = train_rate(model, fast)
        rates["plain"].append(a)
        rates["optimized"].append(b)
        ratios.append(b / a)
    return {
        "plain_batches_per_s": statistics.median(rates["plain"]),
        "optimized_batches_per_s": statistics.median(rates["optimized"]),
        "speedup_median": statistics.median(ratios),
        "speedups": ratios,
    }


def monitoring_overhead(rounds: int) -> dict:
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50)
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30)
    fake.nvmlDeviceGetPowerUsage = lambda h: 100_000
    sys.modules["pynvml"] = fake
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    images, labels = make_data()
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(256).cache()
    model = make_model()
    ratios = []
    with tempfile.TemporaryDirectory() as log_dir:
        for i in range(rounds):
            # Alternate which goes first: the machine's drift hits both alike.
            watchers = [Throughput(256, log_dir), GPUMonitor(log_dir, interval=0.1)]
            if i % 2:
                watched = train_rate(model, ds, steps=200, callbacks=watchers)
                base = train_rate(model, ds, steps=200)
            else:
                base = train_rate(model, ds, steps=200)
                watched = train_rate(model, ds, steps=200, callbacks=watchers)
            ratios.append(base / watched)  # step time with / without
    # The per-step cost itself, below the noise of whole runs: Throughput's
    # batch hook, called directly.
    hook = Throughput(256)
    hook.on_epoch_begin(0)
    calls = 200_000
    start = time.perf_counter()
    for i in range(calls):
        hook.on_train_batch_begin(i)
    per_call = (time.perf_counter() - start) / calls
    step = 1 / statistics.median(train_rate(model, ds, steps=100) for _ in range(3))
    return {
        "step_time_ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "hook_seconds_per_step": per_call,
        "step_seconds": step,
        "hook_share_of_step": per_call / step,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=["monitoring"], default=None)
    args = parser.parse_args()
    if args.only == "monitoring":
        print(json.dumps(monitoring_overhead(args.rounds), indent=1))
        return
    result = {
        "verdicts": verdicts(),
        "optimize": optimize_speedup(args.rounds),
        "monitoring": monitoring_overhead(args.rounds),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "diagnosis.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [
        "# Diagnosis and monitoring",
        "",
        "| workload | verdict | input alone | step alone | together (batches/s) "
        "| memory free |",
        "|---|---|---|---|---|---|",
    ]
    for name, d in result["verdicts"].items():
        free = d["memory_headroom"]
        lines.append(
            f"| {name}-bound workload | {d['bound']} | "
            f"{d['input_batches_per_s']:.1f} | "
            f"{d['step_batches_per_s']:.1f} | {d['training_batches_per_s']:.1f} | "
            f"{'-' if free is None else f'{free:.0%}'} |"
        )
    o, m = result["optimize"], result["monitoring"]
    lines += [
        "",
        "kerascale.data.optimize on the slow-map pipeline: "
        f"{o['plain_batches_per_s']:.1f} -> "
        f"{o['optimized_batches_per_s']:.1f} batches/s, median speed-up "
        f"{o['speedup_median']:.2f}x over {args.rounds} alternating rounds "
        f"(range {min(o['speedups']):.2f}-{max(o['speedups']):.2f}).",
        "",
        f"Throughput + GPUMonitor: step time ratio with/without "
        f"{m['step_time_ratio_median']:.3f} (median of {args.rounds}; range "
        f"{min(m['ratios']):.3f}-{max(m['ratios']):.3f}). Throughput's hook costs "
        f"{m['hook_seconds_per_step'] * 1e6:.2f} us a step, "
        f"{m['hook_share_of_step']:.4%} of a {m['step_seconds'] * 1e3:.1f} ms step.",
    ]
    (RESULTS / "diagnosis.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
