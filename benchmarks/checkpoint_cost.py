"""What a checkpoint save costs training: `FaultTolerantBackup` with saves
written behind training (the default), with synchronous saves
(`async_save=False`), and Keras's own `BackupAndRestore`, against plain
`model.fit`, on the backend of the environment it runs in.

    .venv/bin/python benchmarks/checkpoint_cost.py [--state-mib 137]
        [--every 5] [--train 30] [--rounds 3]
    .venv-jax/bin/python benchmarks/checkpoint_cost.py ...   # JAX

An MLP (1024 inputs, three hidden layers of equal width, 10 outputs) with
Adam, trained on NumPy arrays; its width is set so that the model's and the
optimizer's variables take `--state-mib` MiB (137: 12.0M parameters). A save
comes every `--every` seconds of training (steps counted from a timed
plain epoch), for about `--train` seconds a run. Each round runs, in one
process, plain fit before and after each contestant (plain, async, plain,
sync, plain, keras, plain) and takes each contestant's time against the mean
of the two plain runs beside it, which cancels the machine's drift; the
figures are medians over rounds:

- blocked: the seconds the training thread is held per save (for
  kerascale, `FaultTolerantBackup.save_seconds`: waiting for the save before,
  the copy and, synchronous, the write; for Keras's callback, its save
  method's own time);
- overhead: the run's wall time over plain fit's, as a share of it;
- the host copy of the state on its own (the floor of a save's blocked time)
  and the background write's own time;
- with `--sigterm`, the seconds from SIGTERM to the exit with code 143 (the
  save in flight finished, the final state saved and published) of a
  training process, SIGTERMed just after a save began, against the time a
  preemption notice gives.

Writes benchmarks/results/checkpoint_cost_<backend>_<MiB>.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The environment's backend: .venv-jax has no TensorFlow.
has_tf = importlib.util.find_spec("tensorflow") is not None
os.environ.setdefault("KERAS_BACKEND", "tensorflow" if has_tf else "jax")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _results import write as write_results  # noqa: E402

from kerascale.callbacks import FaultTolerantBackup  # noqa: E402
from kerascale.callbacks import _backup_meta as meta_lib  # noqa: E402
from kerascale.callbacks import _backup_state as state_lib  # noqa: E402

INPUTS, OUTPUTS, BATCH = 1024, 10, 256


def width_for(state_mib: float) -> int:
    """The hidden width whose parameters, with Adam's two slots each, take
    about `state_mib` MiB in float32."""
    params = state_mib * 2**20 / 4 / 3
    a, b, c = 2, INPUTS + OUTPUTS + 3, OUTPUTS - params  # 2h^2 + (..)h + c = 0
    return int((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))


def make_model(width: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((INPUTS,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
        + [keras.layers.Dense(OUTPUTS)]
    )
    model.compile(
        keras.optimizers.Adam(1e-4),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


class _KerasSaves:
    """Times each save of a `keras.callbacks.BackupAndRestore`."""

    def __init__(self, callback: keras.callbacks.BackupAndRestore):
        self.seconds: list[float] = []
        real = callback._save_model

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - started)

        callback._save_model = timed


def run(kind: str, width: int, data, epochs: int, every: int, root: Path) -> dict:
    """One training run of `kind`, timed from `fit`'s call to its return."""
    x, y = data
    model = make_model(width)
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # compiled
    directory = root / kind
    shutil.rmtree(directory, ignore_errors=True)
    callbacks, saves = [], None
    if kind in ("async", "sync"):
        backup = FaultTolerantBackup(
            str(directory), save_freq=every, verbose=0, async_save=kind == "async"
        )
        callbacks = [backup]
    elif kind == "keras":
        backup = keras.callbacks.BackupAndRestore(str(directory), save_freq=every)
        saves = _KerasSaves(backup)
        callbacks = [backup]
    started = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - started
    out = {"seconds": seconds}
    if kind in ("async", "sync"):
        out.update(
            blocked=list(backup.save_seconds),
            waited=list(backup.waited_seconds),
            written=list(backup.write_seconds),
            failed=len(backup.failed_saves),
        )
    elif kind == "keras":
        out["blocked"] = list(saves.seconds)
    shutil.rmtree(directory, ignore_errors=True)
    return out


def host_copy_seconds(width: int, repeats: int = 5) -> tuple[float, int]:
    """The host copy of the state on its own: what a save's blocked time
    cannot go below. Returns (median seconds, bytes)."""
    model = make_model(width)
    x = np.zeros((BATCH, INPUTS), "float32")
    model.fit(x, np.zeros(BATCH, "int32"), batch_size=BATCH, verbose=0)
    objects = meta_lib.trackables(model, global_seed=None)
    seconds, nbytes = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        snapshot = state_lib.snapshot(objects, state_lib.format_name()).ready()
        seconds.append(time.perf_counter() - started)
        nbytes = snapshot.nbytes
        del snapshot
    return statistics.median(seconds), nbytes


class _Steps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"step {int(self.model.optimizer.iterations)}", flush=True)


def sigterm_child(directory: str, width: int, every: int) -> None:
    """Trains with `FaultTolerantBackup` until SIGTERMed (run by `sigterm`)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100 * BATCH, INPUTS)).astype("float32")
    y = rng.integers(0, OUTPUTS, 100 * BATCH).astype("int32")
    backup = FaultTolerantBackup(directory, save_freq=every, verbose=0)
    make_model(width).fit(
        x, y, batch_size=BATCH, epochs=100, verbose=0, callbacks=[backup, _Steps()]
    )


def sigterm(width: int, every: int, repeats: int = 3) -> list[dict]:
    """SIGTERM a training process one step after a save began (its write in
    flight), and time its exit."""
    out = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kerascale-sigterm-") as d:
            cmd = [
                sys.executable,
                __file__,
                "--sigterm-child",
                d,
                "--width",
                str(width),
            ]
            cmd += ["--save-every-steps", str(every)]
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            seen = 0
            for line in proc.stdout:
                if line.startswith("step"):
                    seen = int(line.split()[1])
                    if seen == 2 * every + 1:
                        sent = time.perf_counter()
                        proc.send_signal(signal.SIGTERM)
                        break
            proc.stdout.close()
            code = proc.wait(timeout=600)
            took = time.perf_counter() - sent
            from kerascale.callbacks import checkpoint_store as store

            _, meta = next(store.verified(store.scan(d)))
            out.append(
                {
                    "seconds": took,
                    "exit_code": code,
                    "saved_step": meta["global_step"],
                    "signalled_at": seen,
                }
            )
            print(f"SIGTERM at step {seen}: exit {code} after {took:.2f} s", flush=True)
    return out


def main() -> None:
    if "--sigterm-child" in sys.argv:
        q = argparse.ArgumentParser()
        q.add_argument("--sigterm-child")
        q.add_argument("--width", type=int)
        q.add_argument("--save-every-steps", type=int)
        a = q.parse_args()
        sigterm_child(a.sigterm_child, a.width, a.save_every_steps)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-mib", type=float, default=137.0)
    p.add_argument("--every", type=float, default=5.0, help="seconds between saves")
    p.add_argument("--train", type=float, default=30.0, help="seconds a run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kinds", default="async,sync,keras")
    p.add_argument("--sigterm", action="store_true", help="time SIGTERM's exit")
    args = p.parse_args()
    backend = keras.backend.backend()
    width = width_for(args.state_mib)
    kinds = args.kinds.split(",")

    # Steps per second, from a timed plain run of 20 steps after compiling.
    model = make_model(width)
    rng = np.random.default_rng(0)
    x20 = rng.normal(size=(20 * BATCH, INPUTS)).astype("float32")
    y20 = rng.integers(0, OUTPUTS, 20 * BATCH).astype("int32")
    model.fit(x20[:BATCH], y20[:BATCH], batch_size=BATCH, verbose=0)
    started = time.perf_counter()
    model.fit(x20, y20, batch_size=BATCH, verbose=0)
    step = (time.perf_counter() - started) / 20
    every = max(1, round(args.every / step))
    steps_per_epoch = max(every, round(args.train / step / 4))
    epochs = max(1, round(args.train / step / steps_per_epoch))
    samples = steps_per_epoch * BATCH
    x = rng.normal(size=(samples, INPUTS)).astype("float32")
    y = rng.integers(0, OUTPUTS, samples).astype("int32")
    params = model.count_params()
    print(
        f"{backend}: width {width}, {params / 1e6:.1f}M parameters, step "
        f"{step * 1e3:.0f} ms, a save every {every} steps (~{every * step:.1f} s), "
        f"{epochs} epochs of {steps_per_epoch} steps",
        flush=True,
    )
    copy_seconds, nbytes = host_copy_seconds(width)
    print(f"host copy of the state: {nbytes / 2**20:.0f} MiB in {copy_seconds:.3f} s")

    terms = sigterm(width, every) if args.sigterm else []
    runs: dict[str, list[dict]] = {k: [] for k in ["plain", *kinds]}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="kerascale-ckpt-cost-") as tmp:

        def timed(kind: str, r: int) -> float:
            result = run(kind, width, (x, y), epochs, every, Path(tmp))
            runs[kind].append(result)
            print(f"round {r + 1} {kind}: {result['seconds']:.1f} s", flush=True)
            return result["seconds"]

        for r in range(args.rounds):
            before = timed("plain", r)
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                seconds = timed(kind, r)
                after = timed("plain", r)
                ratios[kind].append(seconds / ((before + after) / 2))
                before = after

    plain = statistics.median(r["seconds"] for r in runs["plain"])
    rows = {}
    for kind in kinds:
        blocked = [b for r in runs[kind] for b in r["blocked"]]
        seconds = statistics.median(r["seconds"] for r in runs[kind])
        rows[kind] = {
            "seconds": seconds,
            "overhead": statistics.median(ratios[kind]) - 1,
            "overheads": [x - 1 for x in ratios[kind]],
            "saves": len(blocked),
            "blocked_median": statistics.median(blocked) if blocked else None,
            "blocked_max": max(blocked) if blocked else None,
        }
        if kind in ("async", "sync"):
            written = [w for r in runs[kind] for w in r["written"]]
            waited = [w for r in runs[kind] for w in r["waited"]]
            rows[kind]["write_median"] = statistics.median(written)
            rows[kind]["waits"] = sum(w > 0.01 for w in waited)
            rows[kind]["failed"] = sum(r["failed"] for r in runs[kind])

    names = {
        "async": "FaultTolerantBackup (async)",
        "sync": "FaultTolerantBackup(async_save=False)",
        "keras": "keras BackupAndRestore",
    }
    print(
        f"\n{backend}, {params / 1e6:.1f}M parameters, {nbytes / 2**20:.0f} MiB of "
        f"state, a save every ~{every * step:.1f} s of training; plain fit "
        f"{plain:.1f} s (median of {args.rounds}); host copy "
        f"{copy_seconds * 1e3:.0f} ms"
    )
    print("| callback | blocked per save (median / max) | write | wall over plain |")
    print("|---|---|---|---|")
    for kind, row in rows.items():
        write = row.get("write_median")
        shown = f"{write * 1e3:.0f} ms" if write is not None else "-"
        print(
            f"| {names[kind]} | {row['blocked_median'] * 1e3:.0f} / "
            f"{row['blocked_max'] * 1e3:.0f} ms | {shown} | "
            f"{row['overhead'] * 100:+.1f}% |"
        )
    write_results(
        f"checkpoint_cost_{backend}_{round(args.state_mib)}",
        backend=backend,
        parameters=params,
        state_bytes=nbytes,
        step_seconds=step,
        save_every_steps=every,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        host_copy_seconds=copy_seconds,
        plain_seconds=plain,
        sigterm=terms,
        rows=rows,
        runs=runs,
    )


if __name__ == "__main__":
    main()
