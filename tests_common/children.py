"""Helpers both test suites share (TensorFlow's in `tests/`, JAX's in
`tests_jax/`, which runs without TensorFlow): training children that report
their steps, killed for real at a chosen step, and what they wrote.

Imports nothing but the standard library and NumPy, so that either
environment can import it (`pythonpath` in pyproject.toml's pytest section).
"""

import random
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
        return
    raise AssertionError(f"the run ended before step {step}")
