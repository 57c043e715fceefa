"""Helpers both test suites share (TensorFlow's in `tests/`, JAX's in
`tests_jax/`, which runs without TensorFlow): training children that report
their steps, killed for real at a chosen step, and what they wrote.

Imports nothing but the standard library and NumPy, so that either
environment can import it (`pythonpath` in pyproject.toml's pytest section).
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np


def run_and_kill(command, kill_after_step, sig=signal.SIGKILL, timeout=120):
    """Starts `command` (a child that prints ``step N`` after each step),
    waits until it reports `kill_after_step`, sleeps a random fraction of a
    step (so the signal lands anywhere in it, a save included) and sends
    `sig`. Returns (its return code, the last step it reported)."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    seen, sent = 0, False
    try:
        for line in proc.stdout:
            if line.startswith("step"):
                seen = int(line.split()[1])
                if seen >= kill_after_step and not sent:
                    time.sleep(random.uniform(0, 0.02))
                    proc.send_signal(sig)
                    sent = True
        return proc.wait(timeout=timeout), seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def load_npz(path):
    """Every array of an `.npz` a child wrote, as a dict, the file closed."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


class TrainingChild:
    """A child script that trains, called as ``script DIRECTORY OUT
    [flags]`` and printing ``step N`` after each step (both suites'
    `backup_child.py`)."""

    def __init__(self, script):
        self.script = script

    def command(self, directory, out, *extra):
        return [sys.executable, str(self.script), str(directory), str(out), *extra]

    def run(self, directory, out, *extra, timeout=240):
        """Runs it to the end; fails the test on a non-zero exit."""
        result = subprocess.run(
            self.command(directory, out, *extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    def run_and_kill(self, directory, out, kill_after_step, *extra, sig=signal.SIGKILL):
        """Runs it with a short sleep after each step and sends `sig` once
        it reports `kill_after_step` (`run_and_kill`)."""
        command = self.command(directory, out, "--step-sleep", "0.01", *extra)
        return run_and_kill(command, kill_after_step, sig=sig)


class Interrupt(Exception):
    """Stands for a kill, in-process: raised from a callback after a step (as
    Keras's own BackupAndRestore tests interrupt `fit`)."""


def interrupted(train, directory, step, **kwargs):
    """Runs `train(directory, callbacks=[...], **kwargs)` (a `backup_child`'s
    training, in this process) and stops it with `Interrupt` after global
    step `step`; fails if the run ends first."""
    import keras  # both environments have it; imported only when used

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) >= step:
                raise Interrupt(step)

    try:
        train(directory, callbacks=[StopAt()], **kwargs)
    except Interrupt:
        # Keras calls no hook after a callback raised: the save in flight
        # is published by its own thread, which a process exit waits for.
        from kerascale.callbacks import _backup_writer

        _backup_writer.wait_all()
        return
    raise AssertionError(f"the run ended before step {step}")


def killed_in_the_4th_save(command, store, directory, *, behind):
    """Runs `command`, a child saving every 3 steps that SIGKILLs itself
    inside its 4th save (step 12), and checks what the kill left: that save
    never became a checkpoint, and the 3rd (step 9) verifies. `behind`: the
    child killed itself two steps after the save began (`die_behind_training`
    printed both steps; the training thread prints its steps meanwhile, and a
    line of either may begin inside the other's), so it trained on while the
    save was written. `store`: kerascale's checkpoint_store."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    if behind:
        found = re.search(r"behind (\d+) (\d+)", proc.stdout)
        assert found, proc.stdout[-2000:]
        saved_at, killed_at = int(found.group(1)), int(found.group(2))
        assert (saved_at, killed_at >= saved_at + 2) == (12, True)  # trained on
    checkpoints = store.scan(str(directory))
    assert (checkpoints[0].number, checkpoints[0].state) == (4, "leftover")
    assert store.verify(checkpoints[1])["global_step"] == 9


def die_behind_training(store, nth, steps, ahead=2, timeout=60.0):
    """Makes this process SIGKILL itself inside its `nth` checkpoint write
    once training has gone `ahead` steps past the save (`steps[0]`: the
    steps done, which the child's progress callback keeps), printing
    "behind S T" first (the save's step, the step at the kill): a kill
    during a write behind training. Where saves are written on the training
    thread, training cannot move during a write: it dies after `timeout`
    seconds, at the save's step. `store`: kerascale's checkpoint_store."""
    count = [0]
    real_publish = store.publish

    def publish(directory, number, write_state, meta, before_commit=None):
        count[0] += 1
        if count[0] == nth:
            real_write, saved_at = write_state, meta["global_step"]

            def write_state(prefix):
                hashed = real_write(prefix)
                deadline = time.monotonic() + timeout
                while steps[0] < saved_at + ahead and time.monotonic() < deadline:
                    time.sleep(0.01)
                sys.stdout.write(f"behind {saved_at} {steps[0]}\n")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
                return hashed

        return real_publish(directory, number, write_state, meta, before_commit)

    store.publish = publish
