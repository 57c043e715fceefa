"""A training script for the checkpointing tests, run in a child process.

    python backup_child.py DIR OUT.npz [--epochs 5] [--save-freq 3]
        [--step-sleep 0.01] [--die-in-save POINT:N] [--sigterm-handler]
        [--via-fit] [--lr 0.01] [--hold-at STEP:PATH]

Trains a small model with Dropout on a seeded, shuffled `tf.data` pipeline,
with `FaultTolerantBackup(DIR)`, and writes the final weights, optimizer
variables and History to OUT.npz. Prints "step G" after every batch so the
parent knows where it is. `--die-in-save POINT:N` SIGKILLs itself at POINT
inside the N-th checkpoint write (a fault injected into the save);
POINT "behind" kills it once training has gone 2 steps past that save, its
write still in flight (tests_common/children.die_behind_training).
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import kerascale
from kerascale.callbacks import checkpoint_store as store

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests_common"))
import children

STEPS = [0]  # the steps done, for die_behind_training


def build(lr=0.01, units=16):
    """The seeded model and shuffled `tf.data` pipeline, made afresh."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(512, 1))).astype(
        "float32"
    )
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=1).batch(16)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="mse", metrics=["mae"])
    return model, ds


def train(
    directory,
    *,
    epochs=5,
    save_freq="3",
    via_fit=False,
    no_backup=False,
    lr=0.01,
    units=16,
    callbacks=(),
    fit_options=None,
):
    """Trains as the script does, in this process; returns what OUT.npz
    holds (weights, optimizer variables, iterations, History as JSON)."""
    model, ds = build(lr, units)
    save_freq = int(save_freq) if str(save_freq).isdigit() else save_freq
    callbacks = list(callbacks)
    if no_backup:
        history = model.fit(ds, epochs=epochs, callbacks=callbacks, verbose=0)
    elif via_fit:
        history = kerascale.fit(
            model,
            ds,
            epochs=epochs,
            checkpoint_dir=str(directory),
            checkpoint_freq=save_freq,
            callbacks=callbacks,
            verbose=0,
            **(fit_options or {}),
        )
    else:
        backup = kerascale.callbacks.FaultTolerantBackup(
            str(directory), save_freq=save_freq
        )
        history = model.fit(
            ds, epochs=epochs, callbacks=[backup, *callbacks], verbose=0
        )
    arrays = {f"w{i}": w.numpy() for i, w in enumerate(model.variables)}
    arrays.update({f"o{i}": w.numpy() for i, w in enumerate(model.optimizer.variables)})
    arrays["iterations"] = np.array(int(model.optimizer.iterations.numpy()))
    arrays["history"] = np.array(json.dumps(history.history))
    arrays["plan"] = np.array(
        json.dumps(getattr(history, "plan", None) and history.plan.to_dict())
    )
    return arrays


def main():
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--save-freq", default="3")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--die-in-save", default=None)
    p.add_argument("--sigterm-handler", action="store_true")
    p.add_argument("--via-fit", action="store_true")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--units", type=int, default=16)
    p.add_argument("--no-backup", action="store_true")
    p.add_argument("--hold-at", default=None)  # STEP:PATH: waits at STEP for PATH
    args = p.parse_args()
    hold_step, _, hold_path = (args.hold_at or "0:").partition(":")

    if args.die_in_save:
        install_fault(*args.die_in_save.split(":"))
    if args.sigterm_handler:
        marker = args.out + ".handler"

        def user_handler(signum, frame):
            with open(marker, "w") as f:
                f.write(str(signum))

        signal.signal(signal.SIGTERM, user_handler)

    class Progress(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.done = 0

        def on_train_batch_end(self, batch, logs=None):
            self.done = STEPS[0] = int(self.model.optimizer.iterations.numpy())
            print(f"step {self.done}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            while hold_path and self.done >= int(hold_step):
                if os.path.exists(hold_path):
                    break
                time.sleep(0.05)  # the run stays mid-way, however slow the test

    started = time.perf_counter()
    arrays = train(
        args.directory,
        epochs=args.epochs,
        save_freq=args.save_freq,
        via_fit=args.via_fit,
        no_backup=args.no_backup,
        lr=args.lr,
        units=args.units,
        callbacks=[Progress()],
    )
    print(f"train_seconds {time.perf_counter() - started:.3f}", flush=True)
    if args.sigterm_handler:
        print(
            "handler restored:", signal.getsignal(signal.SIGTERM).__name__, flush=True
        )
    np.savez(args.out, **arrays)
    print("done", flush=True)


def install_fault(point, nth):
    """SIGKILLs this process at `point` inside the `nth` checkpoint write."""
    nth = int(nth)
    if point == "behind":
        children.die_behind_training(store, nth, STEPS)
        return
    count = {"publish": 0}
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    real_publish = store.publish

    def publish(directory, number, write_state, meta, before_commit=None):
        count["publish"] += 1
        if count["publish"] != nth:
            return real_publish(directory, number, write_state, meta, before_commit)
        if point == "before-state":
            real_write = write_state

            def write_state(prefix):
                die()
                real_write(prefix)
        elif point == "mid-state":
            real_write = write_state

            def write_state(prefix):
                real_write(prefix)
                data = next(iter(tf.io.gfile.glob(prefix + ".data*")))
                with open(data, "r+b") as f:
                    f.truncate(os.path.getsize(data) // 2)
                die()
        elif point == "meta-temp":
            real_write_bytes = store.write_bytes

            def write_bytes(path, data):
                if ".tmp-" in path:
                    with open(path, "wb") as f:
                        f.write(data[: len(data) // 2])
                    die()
                real_write_bytes(path, data)

            store.write_bytes = write_bytes
        elif point == "after-commit":
            from kerascale import _fs

            real_remove = _fs.remove

            def remove(path):
                if path.endswith(store.INCOMPLETE):
                    die()
                real_remove(path)

            _fs.remove = remove
        else:
            sys.exit(f"unknown fault point {point}")
        return real_publish(directory, number, write_state, meta, before_commit)

    store.publish = publish


if __name__ == "__main__":
    main()
