"""kerascale.tuner: real keras-tuner searches over batch size on tiny data."""

import json

import keras
import keras_tuner
import numpy as np
import pytest
from oom_seam import OutOfMemoryAbove
from probe_helpers import small_convnet

import kerascale
from kerascale import tuner as kt_lib
from kerascale.measure.cache import model_fingerprint
from kerascale.tuner import INFEASIBLE, ScaledHyperModel

X = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
Y = (X[:, :4].sum(axis=1) > 0).astype("float32")


def build(hp):
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(hp.Choice("units", [4, 8]), activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def build_with_seam(hp):
    model = keras.Sequential(
        [
            keras.Input((8,)),
            OutOfMemoryAbove(64),
            keras.layers.Dense(hp.Choice("units", [4, 8]), activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    return model


def trials_of(tuner):
    return list(tuner.oracle.trials.values())


def build_convnet(hp):
    return small_convnet()


def test_random_search_stays_within_the_measured_bound(tmp_path):
    """The bound is measured for real: a convnet under a real resident-memory
    limit of this process's memory and 400 MiB more (the limit counts the
    process where fit trains: this one) holds far fewer images than the
    range's 4096. The range is lowered to it, every batch tried is within
    it, and the search finishes with keras-tuner's files in place."""
    from kerascale.sense import memory

    x = np.zeros((512, 32, 32, 3), "float32")
    y = np.zeros(512, "int64")
    memory.release_freed()
    hypermodel = ScaledHyperModel(
        build_convnet,
        batch_size=(8, 4096),
        memory_limit=memory.resident_bytes() + (400 << 20),
        precision=("float32",),
        verbose=0,
    )
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="loss",
        max_trials=2,
        directory=str(tmp_path),
        project_name="search",
        seed=1,
    )
    tuner.search(x, y, epochs=1, verbose=0)
    trials = trials_of(tuner)
    assert len(trials) == 2
    assert all(t.status == "COMPLETED" for t in trials)
    (bound,) = hypermodel.bounds.values()
    assert 8 <= bound < 4096  # memory, not the range, set it
    space = {hp.name: hp for hp in tuner.oracle.hyperparameters.space}
    top = space["batch_size"].max_value
    assert top <= bound < top * 2  # the largest power-of-two step that fits
    tried = [t.hyperparameters.values["batch_size"] for t in trials]
    assert all(b <= bound for b in tried), (tried, bound)
    assert hypermodel.infeasible == {}
    # keras-tuner's own files, as users know them.
    project = tmp_path / "search"
    assert (project / "oracle.json").exists()
    for t in trials:
        saved = json.loads((project / f"trial_{t.trial_id}" / "trial.json").read_text())
        assert saved["status"] == "COMPLETED"
        assert "loss" in saved["metrics"]["metrics"]
    assert tuner.get_best_hyperparameters()[0].values["batch_size"] in tried


def test_an_oom_trial_is_infeasible_and_the_search_goes_on(tmp_path, monkeypatch):
    """Batches above 64 run out of memory (the seam) where the bound said
    1024 fit: those trials are recorded infeasible with the reason, and with
    max_consecutive_failed_trials=1 the search still runs every trial."""
    monkeypatch.setattr(ScaledHyperModel, "_bound", lambda self, *a: 1024)
    hypermodel = ScaledHyperModel(
        build_with_seam, batch_size=(16, 1024), precision=("float32",), verbose=0
    )
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="val_loss",
        max_trials=5,
        max_consecutive_failed_trials=1,
        directory=str(tmp_path),
        project_name="oom",
        seed=3,
    )
    tuner.search(X, Y, epochs=1, validation_split=0.25, verbose=0)
    trials = trials_of(tuner)
    assert len(trials) == 5
    assert all(t.status == "COMPLETED" for t in trials)
    infeasible = [t for t in trials if t.metrics.exists(INFEASIBLE)]
    feasible = [t for t in trials if not t.metrics.exists(INFEASIBLE)]
    assert infeasible and feasible
    for t in infeasible:
        assert t.hyperparameters.values["batch_size"] > 64
        assert "ran out of memory" in t.message
        assert "ResourceExhaustedError" in t.message
        saved = json.loads(
            (tmp_path / "oom" / f"trial_{t.trial_id}" / "trial.json").read_text()
        )
        assert "infeasible" in saved["message"]
        # Scored as the worst the search had seen when it ended.
        order = tuner.oracle.end_order
        before = [
            f.score
            for f in feasible
            if order.index(f.trial_id) < order.index(t.trial_id)
        ]
        if before:
            assert t.score == max(before)
        else:  # nothing seen yet: the untrained model's loss
            assert np.isfinite(t.score)
    for t in feasible:
        assert t.hyperparameters.values["batch_size"] <= 64
    best = tuner.get_best_hyperparameters()[0].values["batch_size"]
    assert best <= 64
    assert set(hypermodel.infeasible) == {t.trial_id for t in infeasible}


def test_a_batch_above_a_configurations_bound_is_not_trained(tmp_path, monkeypatch):
    """The wider model holds less: its trials above its bound are infeasible
    without training (fit is never called for them)."""
    bounds = {4: 1024, 8: 32}

    def bound(self, model, x, y, precision):
        return bounds[model.layers[0].units]

    monkeypatch.setattr(ScaledHyperModel, "_bound", bound)
    fitted = []
    real_fit = kerascale.fit

    def spy(model, *args, **kwargs):
        fitted.append((model.layers[0].units, kwargs["batch_size"]))
        return real_fit(model, *args, **kwargs)

    monkeypatch.setattr(kerascale, "fit", spy)
    hypermodel = ScaledHyperModel(build, batch_size=(16, 256), verbose=0)
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="val_accuracy",
        max_trials=8,
        directory=str(tmp_path),
        project_name="bounds",
        seed=5,
    )
    tuner.search(X, Y, epochs=1, validation_split=0.25, verbose=0)
    for units, batch in fitted:
        assert batch <= bounds[units]
    for t in trials_of(tuner):
        v = t.hyperparameters.values
        if v["batch_size"] > bounds[v["units"]]:
            assert t.metrics.exists(INFEASIBLE)
            assert "larger than the 32 that fits" in t.message
            # val_accuracy is maximised: an infeasible trial gets the lowest.
            assert t.score <= min(
                (s.score for s in trials_of(tuner) if not s.metrics.exists(INFEASIBLE)),
                default=1.0,
            )


@pytest.mark.parametrize("tuner_class", ["BayesianOptimization", "Hyperband"])
def test_other_tuners(tmp_path, tuner_class, monkeypatch):
    if tuner_class == "BayesianOptimization":
        # Not in the test extra: with scikit-learn installed TensorFlow imports
        # it in every process, which breaks the real-memory-limit tests.
        pytest.importorskip("sklearn", reason="needs keras-tuner[bayesian]")
    monkeypatch.setattr(ScaledHyperModel, "_bound", lambda self, *a: 64)
    hypermodel = ScaledHyperModel(
        build,
        batch_size=(16, 128),
        precision=("float32", "mixed_bfloat16"),
        lr_scaling=("none", "linear"),
        base_batch_size=32,
        verbose=0,
    )
    kwargs = {"max_trials": 4} if tuner_class != "Hyperband" else {"max_epochs": 3}
    tuner = getattr(keras_tuner, tuner_class)(
        hypermodel,
        objective="val_loss",
        directory=str(tmp_path),
        project_name=tuner_class,
        seed=0,
        **kwargs,
    )
    tuner.search(X, Y, epochs=2, validation_split=0.25, verbose=0)
    trials = trials_of(tuner)
    assert trials and all(t.status == "COMPLETED" for t in trials)
    assert all(t.hyperparameters.values["batch_size"] <= 64 for t in trials)
    assert {"precision", "lr_scaling"} <= set(trials[-1].hyperparameters.values)
    best = tuner.get_best_models(1)[0]
    assert best.predict(X[:4], verbose=0).shape == (4, 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": (64, 16)}, "min \\(64\\) is larger than its max \\(16\\)"),
        ({"batch_size": (0, 16)}, "batch_size"),
        ({"batch_size": 32}, "batch_size"),
        ({"batch_size": (8.0, 16)}, "batch_size"),
        ({"batch_step": 1}, "batch_step"),
        ({"precision": ("float16",)}, "precision"),
        ({"precision": "float32"}, "precision"),
        ({"lr_scaling": ("cubic",), "base_batch_size": 32}, "lr_scaling"),
        ({"lr_scaling": ("linear",)}, "base_batch_size"),
        ({"epochs": 3}, "unknown option epochs"),
        ({"accumulate": "yes"}, "accumulate"),
        ({"build": 3}, "build"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    kwargs = {"build": build, **kwargs}
    with pytest.raises(kerascale.ConfigurationError, match=match):
        ScaledHyperModel(kwargs.pop("build"), **kwargs)


def test_batch_size_in_search_is_refused(tmp_path):
    hypermodel = ScaledHyperModel(build, batch_size=(16, 32), verbose=0)
    with pytest.raises(kerascale.ConfigurationError, match="batch_size is the hyper"):
        hypermodel.fit(
            keras_tuner.HyperParameters(),
            build(keras_tuner.HyperParameters()),
            X,
            Y,
            batch_size=8,
        )


def test_declared_range_stops_at_the_bound():
    hm = ScaledHyperModel(build, batch_size=(16, 1024))
    assert hm._range_max(1024) == 1024
    assert hm._range_max(300) == 256
    assert hm._range_max(8) == 16  # even the min does not fit: trials say so
    assert ScaledHyperModel(build, batch_size=(24, 100))._range_max(None) == 96
    assert (
        ScaledHyperModel(build, batch_size=(16, 1024), accumulate=True)._range_max(100)
        == 1024
    )


def test_tuner_is_reachable_from_the_package():
    assert kerascale.tuner is kt_lib


def test_a_trial_s_plan_names_the_trial_as_the_batch_s_chooser(tmp_path):
    """A trial's plan says the trial's hyperparameter chose its batch, not
    "batch_size you passed" (issue 55); outside a trial, the user's words."""
    x, y = np.zeros((64, 32, 32, 3), "float32"), np.zeros(64, "int64")
    hm = ScaledHyperModel(build_convnet, batch_size=(8, 8), precision=("float32",))
    hm.bounds[(model_fingerprint(small_convnet())[:12], "float32")] = 64
    history = hm.fit(
        keras_tuner.HyperParameters(), small_convnet(), x, y, epochs=1, verbose=0
    )
    why = history.plan.reasons["global_batch_size"]
    assert why.code == "batch.chosen_by" and "this trial's hyperparameter (8)" in why
    plain = kerascale.plan(small_convnet(), x, y, batch_size=8, verbose=0)
    assert plain.reasons["global_batch_size"].code == "batch.passed"


def test_the_bound_is_searched_for_the_samples_validation_split_trains(monkeypatch):
    """With `validation_split=0.2`, fit trains on the first 80% of the arrays:
    the bound is searched for those, as fit holds them (issue 55: the whole
    data was counted)."""
    seen = []

    def find_batch_size(model, x, y, **kwargs):
        seen.append((len(x), len(y)))
        raise RuntimeError("measured")

    monkeypatch.setattr(kerascale, "find_batch_size", find_batch_size)
    x, y = np.zeros((101, 32, 32, 3), "float32"), np.zeros(101, "int64")
    hm = ScaledHyperModel(build_convnet, batch_size=(8, 64))
    with pytest.raises(RuntimeError, match="measured"):
        hm.fit(
            keras_tuner.HyperParameters(),
            small_convnet(),
            x,
            y,
            epochs=1,
            validation_split=0.2,
            verbose=0,
        )
    assert seen == [(80, 80)]  # floor(101 * 0.8), as Keras splits


def test_an_infeasible_first_trial_is_scored_by_the_untrained_model(recwarn):
    """With no feasible trial yet, an infeasible one scores the untrained
    model's own loss on a few batches, arrays or a dataset (it fell back to
    1e6 with a warning: the helper it called did not exist)."""
    import tensorflow as tf

    model = small_convnet()
    x, y = np.random.default_rng(0).random((64, 32, 32, 3), "float32"), np.ones(64)
    objective = keras_tuner.Objective("loss", "min")
    loss = model.evaluate(x[:256], y[:256], batch_size=8, verbose=0)
    on_arrays = kt_lib._untrained_value(objective, model, x, y, {})
    assert on_arrays == pytest.approx(loss, rel=1e-4)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    assert np.isfinite(kt_lib._untrained_value(objective, model, ds, None, {}))
    assert not [w for w in recwarn if "untrained model failed" in str(w.message)]


def test_the_first_trial_says_its_batch_which_keras_tuner_s_table_lacks(
    tmp_path, monkeypatch, capsys
):
    """keras-tuner prints a trial's hyperparameters before it starts, and
    batch_size's range is known only once the first trial has measured the
    bound on the data: that trial's table has no batch_size (issue 55), so
    kerascale says it; later tables have it, and nothing more is said."""
    monkeypatch.setattr(ScaledHyperModel, "_bound", lambda self, *a: 48)
    hypermodel = ScaledHyperModel(build_convnet, batch_size=(8, 64), verbose=0)
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective="loss",
        max_trials=2,
        directory=str(tmp_path),
        project_name="table",
        seed=2,
    )
    x, y = np.zeros((64, 32, 32, 3), "float32"), np.zeros(64, "int64")
    tuner.search(x, y, epochs=1, verbose=1)
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if ln.startswith("kerascale: trial")]
    first = trials_of(tuner)[0]
    batch = first.hyperparameters.values["batch_size"]
    assert said == [
        f"kerascale: trial {first.trial_id}: batch_size {batch} (of 8..32, "
        "below the 48 that fits)"
    ], said
