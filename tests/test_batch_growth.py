"""The run's controller and the batch that grows inside the run (issue 78),
on TensorFlow; tests_jax/test_jax_batch_growth.py runs the same cases on
JAX. The decision itself (`goodput.grow`) is tests/test_goodput.py's."""

import growth_cases
import keras
import pytest

import kerascale
from kerascale.apply import batch_growth


# On keras-nightly too: the segments rest on how Keras calls callbacks.
@pytest.mark.nightly
def test_callbacks_see_one_run_across_two_changes():
    growth_cases.check_one_run_across_changes()


# On keras-nightly too: the segments rest on how Keras calls callbacks.
@pytest.mark.nightly
def test_early_stopping_keeps_its_patience_across_a_change():
    growth_cases.check_early_stopping_keeps_its_patience()


# On keras-nightly too: the segments rest on how Keras calls callbacks.
@pytest.mark.nightly
def test_a_csv_logger_writes_one_file_across_changes(tmp_path):
    growth_cases.check_csv_logger_writes_one_file(tmp_path / "log.csv")


def test_an_error_in_a_later_segment_leaves_the_callbacks_as_they_were():
    growth_cases.check_an_error_leaves_the_callbacks_as_they_were()


# On keras-nightly too: the segments rest on how Keras calls callbacks.
@pytest.mark.nightly
def test_the_learning_rate_follows_the_batch_and_is_put_back(monkeypatch):
    growth_cases.check_the_learning_rate_follows_the_batch(monkeypatch)


def test_a_kept_batch_trains_model_fit_s_weights(monkeypatch):
    growth_cases.check_a_kept_batch_trains_model_fit_s_weights(monkeypatch)


def test_the_batch_joins_the_steps_first_move(monkeypatch):
    growth_cases.check_the_batch_joins_the_steps_first_move(monkeypatch)


def test_a_real_run_records_its_batch_and_noise_scale_each_epoch():
    growth_cases.check_a_real_run_grows_or_says_why()


def _why(m=None, fit_kwargs=None, callbacks=(), samples=4096):
    kwargs = {"epochs": 5, **(fit_kwargs or {})}
    return batch_growth.wanted(
        m or growth_cases.model(),
        batch=32,
        samples=samples,
        fit_kwargs=kwargs,
        callbacks=list(callbacks),
    )


class _OwnStep(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


def _own_step_model():
    m = _OwnStep([keras.Input((8,)), keras.layers.Dense(1)])
    m.compile("adam", "mse")
    return m


class _PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


@pytest.mark.parametrize(
    "case, words",
    [
        (lambda: _why(growth_cases.model(keras.optimizers.Lion())), "Lion"),
        (
            lambda: _why(
                growth_cases.model(
                    keras.optimizers.Adam(
                        keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9)
                    )
                )
            ),
            "schedule",
        ),
        (lambda: _why(_own_step_model()), "train_step"),
        (lambda: _why(fit_kwargs={"steps_per_epoch": 10}), "steps_per_epoch"),
        (lambda: _why(fit_kwargs={"class_weight": {0: 1.0, 1: 2.0}}), "class_weight"),
        (lambda: _why(fit_kwargs={"epochs": 2}), "fewer than 3 epochs"),
        (lambda: _why(samples=1000), "no larger batch"),
        (lambda: _why(callbacks=[_PerBatch()]), "on_train_batch_end"),
        (
            lambda: _why(
                callbacks=[keras.callbacks.LearningRateScheduler(lambda e, lr: lr)]
            ),
            "LearningRateScheduler",
        ),
        (
            lambda: _why(callbacks=[keras.callbacks.BackupAndRestore("/tmp/unused")]),
            "BackupAndRestore",
        ),
        (
            lambda: _why(
                callbacks=[kerascale.callbacks.FaultTolerantBackup("/tmp/unused")]
            ),
            "checkpoint_dir= keeps a grown batch",
        ),
    ],
)
def test_a_run_the_lever_cannot_measure_keeps_its_batch_and_says_why(case, words):
    assert words in case()


def test_a_run_it_can_measure_is_wanted():
    assert _why() == ""
    sgd = growth_cases.model(keras.optimizers.SGD(0.01))
    assert _why(sgd) == ""


def test_plan_says_what_fit_will_do_with_the_batch():
    import kerascale

    x, y = growth_cases.data(samples=4096)
    fixed = {"precision": "float32", "steps_per_execution": 1, "verbose": 0}
    grows = kerascale.plan(growth_cases.model(), x, y, epochs=5, **fixed)
    assert grows.reasons["batch_growth"].code == "growth.in_run"
    row = next(r for r in grows.describe().splitlines() if "batch growth" in r)
    assert row.split()[2:5] == ["in", "the", "run"]
    short = kerascale.plan(growth_cases.model(), x, y, epochs=2, **fixed)
    assert short.reasons["batch_growth"].code == "growth.kept"
    assert "fewer than 3 epochs" in short.describe(full=True)
    # A batch of yours is yours: no row at all.
    yours = kerascale.plan(growth_cases.model(), x, y, epochs=5, batch_size=32, **fixed)
    assert "batch_growth" not in yours.reasons


def test_a_change_whose_first_step_fails_is_undone_with_one_warning():
    growth_cases.check_a_change_whose_first_step_fails_is_undone_with_one_warning()


def test_a_noise_scale_that_cannot_be_measured_drops_growth_with_one_warning(
    monkeypatch,
):
    growth_cases.check_a_noise_scale_that_cannot_be_measured_drops_growth_with_one_warning(
        monkeypatch
    )


def test_a_grown_batch_keeps_validation_at_the_run_s_first_batch(monkeypatch):
    """Validation stays at the batch the run began with (its val_loss the
    same figures for EarlyStopping, its compiled step reused), or at your
    validation_batch_size."""
    x, y = growth_cases.data(samples=2048)
    for yours, expected in ((None, 32), (100, 100)):
        growth_cases.forced(monkeypatch, {0: 64})
        lever = batch_growth.BatchGrowth(
            x, y, None, samples=2048, batch=32, ceiling=2048, validation=yours
        )
        lever.set_model(growth_cases.model())
        lever.set_params({"epochs": 5, "steps": 64})
        for _ in range(2):
            lever.timings.add(32, 0.1, 64)
        assert lever.propose(1, {}) == {
            "batch_size": 64,
            "validation_batch_size": expected,
        }


def test_a_run_too_short_to_repay_a_compile_measures_nothing(monkeypatch):
    growth_cases.check_a_run_too_short_to_repay_a_compile_measures_nothing(monkeypatch)


def test_the_rest_of_the_run_ends_where_early_stopping_could_stop_it():
    x, y = growth_cases.data(samples=2048)
    stopper = keras.callbacks.EarlyStopping(patience=3)
    lever = batch_growth.BatchGrowth(
        x, y, None, samples=2048, batch=32, ceiling=2048, stoppers=(stopper,)
    )
    lever.set_params({"epochs": 20, "steps": 64})
    stopper.wait = 1  # one epoch without improvement: it could stop in 2
    assert lever._epochs_left(5) == 2
    stopper.wait = 0
    assert lever._epochs_left(5) == 3
    assert lever._epochs_left(18) == 1  # the run's end comes first


def test_the_first_measurement_times_the_passes_of_more_samples():
    """The first noise measurement also samples at twice the base, whose
    micro-batches less the base's time the passes of 32 more samples
    (each call's fixed cost cancelled); both samples feed the noise
    scale; later measurements sample at the base only."""
    x, y = growth_cases.data(samples=2048)
    lever = batch_growth.BatchGrowth(x, y, None, samples=2048, batch=32, ceiling=2048)
    lever.set_model(growth_cases.model())
    lever._measure()
    assert lever.scale.samples == 2 and lever.taken == 1
    assert lever.compute_seconds is not None and lever.compute_seconds >= 0
    first = lever.compute_seconds
    lever._measure()
    assert lever.scale.samples == 3 and lever.compute_seconds == first


# On keras-nightly too: the segments rest on how Keras calls callbacks.
@pytest.mark.nightly
def test_a_lever_that_fails_is_dropped_and_the_run_goes_on():
    growth_cases.check_a_lever_that_fails_is_dropped_and_the_run_goes_on()


# On keras-nightly too: the segments rest on how Keras calls callbacks.
@pytest.mark.nightly
def test_two_levers_change_one_segment_and_undo_together():
    growth_cases.check_two_levers_change_one_segment()


# On keras-nightly too: Keras 3.16 seeds an epoch's shuffle from its adapter.
@pytest.mark.nightly
def test_a_run_in_segments_trains_one_fit_s_weights():
    growth_cases.check_segments_train_one_fit_s_weights()


def test_a_resume_goes_on_at_the_grown_batch(monkeypatch, tmp_path, capsys):
    growth_cases.check_a_resume_goes_on_at_the_grown_batch(
        monkeypatch, tmp_path, capsys
    )


@pytest.mark.kill
def test_a_sigkill_resumes_at_the_grown_batch(monkeypatch, tmp_path):
    growth_cases.check_a_sigkill_resumes_at_the_grown_batch(
        monkeypatch, tmp_path, "tensorflow"
    )
