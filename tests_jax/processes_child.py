"""One of several JAX processes on 127.0.0.1, for tests_jax/test_jax_processes.py.

    python processes_child.py MODE PORT COUNT INDEX OUT_JSON [EPOCHS [CHECKPOINT_DIR]]

The environment names the coordinator (JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID): `import kerascale` joins the processes
with no line of the script's own. Each process builds its model from a seed
of its own (so only kerascale's broadcast makes them start alike) and trains
with `kerascale.fit`; MODE "single" instead trains process 0's model with
plain `model.fit` on one device, alone, on the global batch. EPOCHS (3 by
default) and CHECKPOINT_DIR (kerascale's `checkpoint_dir`) are fit's;
STEP_SLEEP (seconds, in the environment) slows each step, for a signal to
arrive mid-run; SAVE_FREQ (steps) is fit's `checkpoint_freq`; INPUT=pydataset
feeds the processes a `keras.utils.PyDataset` of global batches instead of
arrays (each reads all of every batch; kerascale cuts each process's block),
INPUT=generator a generator of them (one pass: EPOCHS 1), INPUT=grain a
grain `MapDataset` batched in them; SHUFFLE=1 passes
fit's shuffle=True (arrays only). CONNECT=import (or explicit) describes the
processes in TF_CONFIG and calls kerascale.connect_cluster() after `import
kerascale` joined them (or, explicit, with KERASCALE_AUTO_CONNECT=0, joins).
WIDE=1 trains a model with a 4 MiB kernel
(two hidden layers of 1024), DEVICE_MEMORY is fit's `device_memory`, and
LOCAL_DEVICES makes each process that many CPU devices. AUTO=1 passes
fit's batch_size="auto" and steps_per_execution="auto" instead of the batch
(arrays only): the levers a single process moves in the run.
Writes JSON: the plan, the losses and the trained weights.
"""

import json
import os
import sys
import time

mode, port, count, index, out = sys.argv[1:6]
EPOCHS = int(sys.argv[6]) if len(sys.argv) > 6 else 3
CHECKPOINTS = sys.argv[7] if len(sys.argv) > 7 else None
os.environ["KERAS_BACKEND"] = "jax"
LOCAL = os.environ.get("LOCAL_DEVICES")
os.environ["XLA_FLAGS"] = (
    f"--xla_force_host_platform_device_count={LOCAL}" if LOCAL else ""
)
CONNECT = os.environ.get("CONNECT")
if mode != "single" and CONNECT:
    # README's cluster script: TF_CONFIG describes the job, and the script
    # calls kerascale.connect_cluster() (after the import joined, or itself
    # with KERASCALE_AUTO_CONNECT=0).
    workers = [f"127.0.0.1:{int(port) + i}" for i in range(int(count))]
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": int(index)},
        }
    )
    if CONNECT == "explicit":
        os.environ["KERASCALE_AUTO_CONNECT"] = "0"
elif mode != "single":
    os.environ["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
    os.environ["JAX_NUM_PROCESSES"] = count
    os.environ["JAX_PROCESS_ID"] = index

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerascale  # noqa: E402  (joins the processes)

CONNECTED = kerascale.connect_cluster() if CONNECT else None

N, BATCH = 101, 16  # the last batch of 5: one sample left out over 2 processes


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 6)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    return x, y


class Batches(keras.utils.PyDataset):
    """The arrays in global batches of BATCH, in order, the last one short."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.x) // BATCH)

    def __getitem__(self, i):
        part = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[part], self.y[part]


def model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    if os.environ.get("WIDE") == "1":
        h = keras.layers.Dense(1024, activation="relu")(inputs)
        h = keras.layers.Dense(1024, activation="relu")(h)
    else:
        h = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(2)(h)
    m = keras.Model(inputs, outputs)
    m.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return m


def _tf_started():
    from kerascale import _tf_compat

    return _tf_compat.tf_started()


def main():
    import jax

    x, y = data()
    result = {"processes": jax.process_count(), "index": jax.process_index()}
    result["connected"] = type(CONNECTED).__name__
    result["tensorflow_started"] = "tensorflow" in sys.modules and _tf_started()
    if mode == "single":
        m = model(seed=0)
        batch = 64 if os.environ.get("AUTO") == "1" else BATCH  # 32 a process
        keep = N - (N % batch) % int(count)
        h = m.fit(
            x[:keep],
            y[:keep],
            batch_size=batch,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )
    else:
        m = model(seed=int(index))  # different on each process
        pause = float(os.environ.get("STEP_SLEEP", "0"))
        slow = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: time.sleep(pause)
        )
        begun = []
        epochs = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: begun.append(epoch)
        )
        result["epochs_begun"] = begun
        if os.environ.get("INPUT") == "pydataset":
            data_args, data_kwargs = (Batches(x, y),), {}
        elif os.environ.get("INPUT") == "generator":  # one pass: 1 epoch
            batches = Batches(x, y)
            data_args = ((batches[i] for i in range(len(batches))),)
            data_kwargs = {}
        elif os.environ.get("INPUT") == "grain":
            import grain

            source = grain.MapDataset.source([(x[i], y[i]) for i in range(N)])
            data_args, data_kwargs = (source.batch(BATCH),), {}
        elif os.environ.get("AUTO") == "1":
            data_args = (x, y)
            data_kwargs = {"batch_size": "auto", "steps_per_execution": "auto"}
        else:
            data_args, data_kwargs = (x, y), {"batch_size": BATCH}
        shuffle = os.environ.get("SHUFFLE") == "1"
        h = kerascale.fit(
            m,
            *data_args,
            **data_kwargs,
            epochs=EPOCHS,
            shuffle=shuffle,
            verbose=0,
            checkpoint_dir=CHECKPOINTS,
            callbacks=[epochs, slow] if pause else [epochs],
            checkpoint_freq=int(os.environ.get("SAVE_FREQ", "0")) or "epoch",
            device_memory=os.environ.get("DEVICE_MEMORY"),
        )
        plan = h.plan
        result["plan"] = {
            "strategy": plan.strategy,
            "replicas": plan.replicas,
            "global_batch_size": plan.global_batch_size,
            "reason": plan.reasons.get("strategy", ""),
            "data_changes": plan.data_changes.to_dict(),
            "sharding": dict(plan.sharding),
            "sharding_reason": plan.reasons.get("sharding", ""),
            "steps_per_execution": plan.steps_per_execution,
            "steps_reason": str(plan.reasons.get("steps_per_execution", "")),
            "growth_reason": str(plan.reasons.get("batch_growth", "")),
        }
        result["batch_sizes"] = h.history.get("batch_size")
        result["distribution_after"] = repr(keras.distribution.distribution())
        # the model is the user's again: it predicts here, alone
        result["predicts"] = bool(np.isfinite(m.predict(x[:3], verbose=0)).all())
    result["loss"] = [float(v) for v in h.history["loss"]]
    result["weights"] = [w.tolist() for w in m.get_weights()]
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
