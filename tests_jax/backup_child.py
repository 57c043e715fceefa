"""A training script for the JAX checkpointing tests, run in a child process.

    python backup_child.py DIR OUT.npz [--input arrays|pydataset|generator]
        [--epochs 4] [--save-freq 3] [--step-sleep 0.01] [--via-fit]
        [--sigterm-handler] [--die-in-save mid-state:N] [--no-backup]
        [--hold-until PATH]

Trains a small model with Dropout and Adam, on 320 samples in batches of 16
(20 steps an epoch), shuffled by Keras (arrays: NumPy's random; PyDataset:
Python's random) or read from an infinite generator with steps_per_epoch,
with `FaultTolerantBackup(DIR)` in `model.fit` (or `kerascale.fit(...,
checkpoint_dir=DIR)` with --via-fit). Writes the final weights, optimizer
variables and History to OUT.npz, and prints "step G" after every batch so
the parent knows where it is. Every process seeds Python's and NumPy's
random alike, so a resume that did not put back the state its epoch's shuffle
drew from would train on another order. `--die-in-save mid-state:N`
truncates the state file of the N-th save and SIGKILLs itself before the
commit; `--die-in-save behind:N` SIGKILLs itself once training has gone 2
steps past the N-th save, its write still in flight
(tests_common/children.die_behind_training).
"""

import argparse
import json
import os
import random
import signal
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"

import keras
import numpy as np

import kerascale
from kerascale.callbacks import checkpoint_store as store

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests_common"))
import children

STEPS = [0]  # the steps done, for die_behind_training

SAMPLES, BATCH = 320, 16


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        s = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[s], self.y[s]


def endless(x, y):
    """The same sequence each time it is created: batch i of a fixed order."""
    order = np.random.default_rng(7).permutation(len(x))
    i = 0
    while True:
        take = order[(np.arange(BATCH) + i * BATCH) % len(x)]
        yield x[take], y[take]
        i += 1


def train(
    directory,
    *,
    input="arrays",
    epochs=4,
    save_freq="3",
    via_fit=False,
    no_backup=False,
    callbacks=(),
):
    """Trains as the script does, in this process (seeded afresh, as each
    process is); returns what OUT.npz holds."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(SAMPLES, 1))).astype(
        "float32"
    )
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    # Each process starts from this state: a resume that did not put back the
    # state of the epoch it resumes in would shuffle as the first epoch did.
    random.seed(12345)
    np.random.seed(12345)
    data: dict = {"epochs": epochs, "verbose": 0}
    if input == "arrays":
        data.update(x=x, y=y, batch_size=BATCH)
    elif input == "pydataset":
        data.update(x=Batches(x, y))
    elif input == "generator":
        data.update(x=endless(x, y), steps_per_epoch=SAMPLES // BATCH)
    else:
        raise ValueError(f"unknown input {input}")
    save_freq = int(save_freq) if str(save_freq).isdigit() else save_freq
    callbacks = list(callbacks)
    if no_backup:
        history = model.fit(callbacks=callbacks, **data)
    elif via_fit:
        history = kerascale.fit(
            model,
            checkpoint_dir=str(directory),
            checkpoint_freq=save_freq,
            callbacks=callbacks,
            precision="float32",
            **data,
        )
    else:
        backup = kerascale.callbacks.FaultTolerantBackup(
            str(directory), save_freq=save_freq
        )
        history = model.fit(callbacks=[backup, *callbacks], **data)
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(model.variables)}
    arrays.update(
        {f"o{i}": np.asarray(w) for i, w in enumerate(model.optimizer.variables)}
    )
    arrays["iterations"] = np.array(int(model.optimizer.iterations.numpy()))
    arrays["history"] = np.array(json.dumps(history.history))
    return arrays


def main():
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("out")
    p.add_argument("--input", default="arrays")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--save-freq", default="3")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--via-fit", action="store_true")
    p.add_argument("--sigterm-handler", action="store_true")
    p.add_argument("--die-in-save", default=None)
    p.add_argument("--no-backup", action="store_true")
    p.add_argument("--hold-until", default=None)  # waits after step 1 for PATH
    args = p.parse_args()

    if args.die_in_save:
        install_fault(*args.die_in_save.split(":"))
    if args.sigterm_handler:
        marker = args.out + ".handler"

        def user_handler(signum, frame):
            with open(marker, "w") as f:
                f.write(str(signum))

        signal.signal(signal.SIGTERM, user_handler)

    class Progress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            STEPS[0] = int(self.model.optimizer.iterations.numpy())
            print(f"step {STEPS[0]}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            while args.hold_until and not os.path.exists(args.hold_until):
                time.sleep(0.05)  # the run stays mid-way, however slow the test

    try:
        arrays = train(
            args.directory,
            input=args.input,
            epochs=args.epochs,
            save_freq=args.save_freq,
            via_fit=args.via_fit,
            no_backup=args.no_backup,
            callbacks=[Progress()],
        )
    except ValueError as e:
        if str(e).startswith("unknown input"):
            sys.exit(str(e))
        raise
    if args.sigterm_handler:
        print("handler:", signal.getsignal(signal.SIGTERM).__name__, flush=True)
    print("tensorflow imported:", "tensorflow" in sys.modules, flush=True)
    np.savez(args.out, **arrays)
    print("done", flush=True)


def install_fault(point, nth):
    """Truncates the state file of the `nth` checkpoint write and SIGKILLs
    this process before its commit ("mid-state"), or kills it during that
    write, behind training ("behind")."""
    if point == "behind":
        children.die_behind_training(store, int(nth), STEPS)
        return
    if point != "mid-state":
        sys.exit(f"unknown fault point {point}")
    nth, count = int(nth), {"publish": 0}
    real_publish = store.publish

    def publish(directory, number, write_state, meta, before_commit=None):
        count["publish"] += 1
        if count["publish"] == nth:
            real_write = write_state

            def write_state(prefix):
                real_write(prefix)
                path = prefix + ".npz"
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
                os.kill(os.getpid(), signal.SIGKILL)

        return real_publish(directory, number, write_state, meta, before_commit)

    store.publish = publish


if __name__ == "__main__":
    main()
