"""kerascale.tuner on JAX, without TensorFlow: a real keras-tuner search over
batch size, bounded by the compiled batch search under a memory limit."""

import json
import sys

import keras
import numpy as np
import pytest

keras_tuner = pytest.importorskip("keras_tuner")

from kerascale.tuner import ScaledHyperModel  # noqa: E402


def build(hp):
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(hp.Choice("units", [8, 16]), activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    return model


@pytest.mark.once
def test_a_random_search_over_batch_size_runs_on_jax(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 16)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("float32")
    hypermodel = ScaledHyperModel(
        build,
        batch_size=(8, 256),
        memory_limit="2GiB",
        precision=("float32",),
        verbose=0,
    )
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="val_loss",
        max_trials=2,
        directory=str(tmp_path),
        project_name="search",
        seed=1,
    )
    tuner.search(x, y, epochs=1, validation_split=0.25, verbose=0)
    trials = list(tuner.oracle.trials.values())
    assert len(trials) == 2 and all(t.status == "COMPLETED" for t in trials)
    assert hypermodel.bounds and all(b >= 8 for b in hypermodel.bounds.values())
    tried = [t.hyperparameters.values["batch_size"] for t in trials]
    assert all(8 <= b <= 256 for b in tried)
    for t in trials:
        saved = json.loads(
            (tmp_path / "search" / f"trial_{t.trial_id}" / "trial.json").read_text()
        )
        assert "val_loss" in saved["metrics"]["metrics"]
    assert keras.backend.backend() == "jax" and "tensorflow" not in sys.modules
