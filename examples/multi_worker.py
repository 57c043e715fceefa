"""Training on several machines with kerascale: the same script everywhere.

On a cluster (TF_CONFIG set by Kubernetes/Vertex AI/Ray, or under SLURM's
`srun`), run this script on every worker. Here, with no cluster around, it
starts two workers on 127.0.0.1 itself to show what happens:

    python examples/multi_worker.py            # 2 local workers
    python examples/multi_worker.py --workers 3

Each worker prints the plan it trains with (the same on all of them); the
chief keeps the checkpoints, so rerunning after a kill resumes (and a rerun
after the end says that training already finished: pass another
--checkpoint-dir to train again).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile


def train(checkpoint_dir: str) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    # On a cluster, importing kerascale joins it (and waits for every
    # worker); a worker silent for KERASCALE_WORKER_TIMEOUT (60 s) is then
    # declared lost and the others stop with an error. Nothing else changes.
    import kerascale

    keras.utils.set_random_seed(0)  # every worker shuffles alike
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 20)).astype("float32")
    y = (x[:, :10].sum(axis=1) > 0).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=1)

    model = keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = kerascale.fit(
        model,
        ds,
        batch_size=256,  # global: each of N workers takes 256 / N
        epochs=3,
        checkpoint_dir=checkpoint_dir,
        verbose=2,
    )
    if "TF_CONFIG" not in os.environ:
        role = "one process"
    else:
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        role = f"{task['type']} {task.get('index', 0)}"
    print(f"[{role}] final accuracy {history.history['accuracy'][-1]:.3f}")


def launch(workers: int, checkpoint_dir: str) -> int:
    """Starts `workers` copies of this script on 127.0.0.1, as a cluster
    manager would, and waits for them."""
    sockets = [socket.socket() for _ in range(workers)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()
    procs = []
    for i in range(workers):
        tf_config = {
            "cluster": {"worker": addresses},
            "task": {"type": "worker", "index": i},
        }
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config)}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        cmd = [sys.executable, __file__, "--checkpoint-dir", checkpoint_dir]
        procs.append(subprocess.Popen(cmd, env=env))
    return max(p.wait() for p in procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()
    checkpoint_dir = args.checkpoint_dir or os.path.join(
        tempfile.gettempdir(), "kerascale-multi-worker-example"
    )
    cluster_vars = ("TF_CONFIG", "CLUSTER_SPEC", "SLURM_STEP_NODELIST")
    if any(os.environ.get(name) for name in cluster_vars):
        train(checkpoint_dir)  # a worker of a real (or launched) cluster
    else:
        sys.exit(launch(args.workers, checkpoint_dir))


if __name__ == "__main__":
    main()
