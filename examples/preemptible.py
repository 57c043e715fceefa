"""A training job that survives being killed: rerun it and it resumes.

    python examples/preemptible.py [/tmp/kerascale-preemptible]

Trains the quickstart CNN for 200 epochs (about 2 minutes on 2 CPU cores) with a
checkpoint every 5 batches.
Kill it however you like (Ctrl-C, `kill -9 PID`, `kill PID`: SIGTERM saves and
exits with code 143), then run the same command again: training continues at
the batch of the last checkpoint, with nothing applied twice, and the final
weights equal those of an uninterrupted run. Delete the directory to start
over.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

import kerascale

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart import make_data, make_model


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "/tmp/kerascale-preemptible"
    keras.utils.set_random_seed(0)
    images, labels = make_data()
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(2048, seed=0)
    model = make_model()
    print(f"pid {os.getpid()}; checkpoints in {directory}", flush=True)
    history = kerascale.fit(
        model,
        ds,
        epochs=200,
        checkpoint_dir=directory,
        checkpoint_freq=5,
        verbose=2,
    )
    print(
        f"trained {len(history.history['loss'])} epochs in all; "
        f"final loss {history.history['loss'][-1]:.4f}"
    )


if __name__ == "__main__":
    main()
