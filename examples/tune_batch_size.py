"""Tune batch size, layer width and precision with keras-tuner, without OOM crashes.

    python examples/tune_batch_size.py                    # a few minutes on CPU
    python examples/tune_batch_size.py --memory-limit 1.2GiB --trials 12

The search space asks for batches from 32 to 16384. kerascale measures the
largest batch that fits (probes in child processes under `--memory-limit`, a
real limit on CPU; the GPU's memory on a GPU) and lowers the range to it, so
the tuner never proposes a batch that cannot fit; a wider model that holds less
is measured too, and its trials above its bound are recorded as infeasible
instead of crashing the search. Compare with plain keras-tuner, where such a
trial dies of out-of-memory and three in a row stop the whole search.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import keras_tuner
import numpy as np

import kerascale
from kerascale.tuner import INFEASIBLE, ScaledHyperModel


def build_model(hp):
    width = hp.Choice("width", [256, 2048])
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def synthetic_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32768, 256)).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int64")
    return x, y


def make_hypermodel(memory_limit: str) -> ScaledHyperModel:
    return ScaledHyperModel(
        build_model,
        batch_size=(32, 16384),
        precision=("float32", "mixed_bfloat16"),
        lr_scaling=("none", "sqrt"),
        base_batch_size=32,
        memory_limit=memory_limit,
        verbose=0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--memory-limit", default="1.2GiB")
    parser.add_argument("--directory", default="kerascale_tuning")
    args = parser.parse_args()

    x, y = synthetic_data()
    hypermodel = make_hypermodel(args.memory_limit)
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="val_accuracy",
        max_trials=args.trials,
        directory=args.directory,
        project_name="batch_size",
        overwrite=True,
        seed=0,
    )
    tuner.search(x, y, epochs=2, validation_split=0.2, verbose=0)

    print("\nlargest batch that fits, per model configuration and precision:")
    for (config, precision), bound in hypermodel.bounds.items():
        print(f"  model {config}  {precision:>15}  {bound}")
    print(f"\n{'trial':>5} {'width':>5} {'batch':>6} {'precision':>15}  result")
    for trial in tuner.oracle.trials.values():
        v = trial.hyperparameters.values
        result = (
            "infeasible: " + hypermodel.infeasible.get(trial.trial_id, "")
            if trial.metrics.exists(INFEASIBLE)
            else f"val_accuracy {trial.score:.3f}"
        )
        print(
            f"{trial.trial_id:>5} {v['width']:>5} {v['batch_size']:>6} "
            f"{v['precision']:>15}  {result}"
        )
    wasted = sum(t.metrics.exists(INFEASIBLE) for t in tuner.oracle.trials.values())
    print(f"\ninfeasible trials (not trained, nothing crashed): {wasted}")
    print("best:", tuner.get_best_hyperparameters()[0].values)
    print("kerascale", kerascale.__version__)


if __name__ == "__main__":
    main()
