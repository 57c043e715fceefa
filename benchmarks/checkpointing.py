"""Fault-tolerant checkpointing: cost of a save and a restore, work lost per
kill against `save_freq`, and the resumed run's difference from an
uninterrupted one.

    python benchmarks/checkpointing.py [--kills 5]

1. Save and restore seconds for the quickstart CNN (batch 64, shuffle buffer
   of 2048 images, which a mid-epoch checkpoint carries), in this process.
2. For each `save_freq`, the training script of the tests
   (tests/backup_child.py: 5 epochs of 32 batches, Dropout, seeded shuffle) is
   SIGKILLed at random steps; lost work is the steps it had trained minus the
   steps in the newest checkpoint. After the kills a rerun finishes the job,
   and its weights and optimizer variables are compared with an
   uninterrupted run's. Each run's training time, with and without the
   backup, gives the overhead.

Writes benchmarks/results/checkpointing.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "backup_child.py"
RESULTS = ROOT / "benchmarks" / "results"


def save_and_restore_seconds(repeats: int = 5) -> dict:
    import keras
    import tensorflow as tf

    sys.path.insert(0, str(ROOT / "examples"))
    from quickstart import make_data, make_model

    from kerascale.callbacks import FaultTolerantBackup

    images, labels = make_data()
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(2048, seed=0)
    ds = ds.batch(64)  # 32 batches
    out = {"mid_epoch_save": [], "epoch_end_save": [], "restore": []}

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 24:
                self.model.stop_training = True

    for _ in range(repeats):
        full, stopped = tempfile.mkdtemp(), tempfile.mkdtemp()
        try:
            keras.utils.set_random_seed(0)
            backup = FaultTolerantBackup(full, save_freq=20, verbose=0)
            make_model().fit(ds, epochs=1, verbose=0, callbacks=[backup])
            out["mid_epoch_save"].append(backup.save_seconds[0])  # batch 20
            out["epoch_end_save"].append(backup.save_seconds[-1])  # end of training
            keras.utils.set_random_seed(0)
            backup = FaultTolerantBackup(stopped, save_freq=100, verbose=0)
            make_model().fit(ds, epochs=1, verbose=0, callbacks=[backup, StopAt()])
            size = sum(p.stat().st_size for p in Path(backup.last_checkpoint).iterdir())
            keras.utils.set_random_seed(0)
            again = FaultTolerantBackup(stopped, save_freq=100, verbose=0)
            make_model().fit(ds, epochs=1, verbose=0, callbacks=[again])
            out["restore"].append(again.restore_seconds)
        finally:
            shutil.rmtree(full, ignore_errors=True)
            shutil.rmtree(stopped, ignore_errors=True)
    return {
        **{k: statistics.median(v) for k, v in out.items()},
        "mid_epoch_checkpoint_bytes": size,
    }


def run_child(directory, out, *extra):
    cmd = [sys.executable, str(CHILD), str(directory), str(out), *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return result.stdout


def kill_at(directory, out, step, *extra):
    cmd = [sys.executable, str(CHILD), str(directory), str(out), "--step-sleep", "0.01"]
    proc = subprocess.Popen(
        [*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    seen = 0
    for line in proc.stdout:
        if line.startswith("step"):
            seen = int(line.split()[1])
            if seen >= step:
                time.sleep(random.uniform(0, 0.02))
                proc.send_signal(signal.SIGKILL)
    proc.wait()
    return seen


def newest_step(directory) -> int:
    from kerascale.callbacks import checkpoint_store as store

    for found in store.scan(str(directory)):
        if found.state == "complete":
            return store.verify(found)["global_step"]
    return 0


def max_difference(a_path, b_path) -> float:
    import numpy as np

    with np.load(a_path) as a, np.load(b_path) as b:
        keys = [k for k in a.files if k != "history"]
        return max(
            float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
            for k in keys
        )


def train_seconds(stdout: str) -> float:
    return float(
        next(
            ln.split()[1]
            for ln in stdout.splitlines()
            if ln.startswith("train_seconds")
        )
    )


def work_lost(kills: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kerascale-bench-") as tmp:
        tmp = Path(tmp)
        base = train_seconds(run_child(tmp / "none", tmp / "none.npz", "--no-backup"))
        for freq in ("1", "4", "16", "epoch"):
            ref_out = run_child(
                tmp / f"ref{freq}", tmp / f"ref{freq}.npz", "--save-freq", freq
            )
            lost = []
            directory = tmp / f"k{freq}"
            for step in sorted(random.sample(range(10, 150), kills)):
                seen = kill_at(directory, tmp / "out.npz", step, "--save-freq", freq)
                lost.append(seen - newest_step(directory))
            run_child(directory, tmp / f"k{freq}.npz", "--save-freq", freq)
            rows.append(
                {
                    "save_freq": freq,
                    "kills": kills,
                    "lost_steps_mean": statistics.mean(lost),
                    "lost_steps_max": max(lost),
                    "max_weight_difference": max_difference(
                        tmp / f"ref{freq}.npz", tmp / f"k{freq}.npz"
                    ),
                    "train_seconds": train_seconds(ref_out),
                    "train_seconds_without_backup": base,
                }
            )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args()
    random.seed(0)
    timing = save_and_restore_seconds()
    rows = work_lost(args.kills)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpointing.json").write_text(
        json.dumps({"timing": timing, "kills": rows}, indent=1)
    )
    lines = [
        "# Fault-tolerant checkpointing",
        "",
        "Quickstart CNN (batch 64, shuffle buffer 2048 images), medians of 5:",
        "",
        f"- save mid-epoch (with the shuffle buffer, "
        f"{timing['mid_epoch_checkpoint_bytes'] / 2**20:.1f} MiB): "
        f"{timing['mid_epoch_save']:.3f} s",
        f"- save at an epoch's end: {timing['epoch_end_save']:.3f} s",
        "- restore (verify, read the state, restore the iterator): "
        f"{timing['restore']:.3f} s",
        "",
        "Kills of tests/backup_child.py (5 epochs x 32 batches; 10 ms sleep per step "
        "while being killed):",
        "",
        "| save_freq | kills | steps lost per kill (mean / max) | max weight "
        "difference after resume | train s with backup | without |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['save_freq']} | {r['kills']} | {r['lost_steps_mean']:.1f} / "
            f"{r['lost_steps_max']} | {r['max_weight_difference']:.1e} | "
            f"{r['train_seconds']:.2f} | {r['train_seconds_without_backup']:.2f} |"
        )
    (RESULTS / "checkpointing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
