"""The run's controller and the batch that grows inside the run (issue 78),
on JAX: tests/test_batch_growth.py's cases (the gates, backend-free, are
tested there)."""

import growth_cases
import jax
import keras
import pytest


def test_callbacks_see_one_run_across_two_changes():
    growth_cases.check_one_run_across_changes()


def test_early_stopping_keeps_its_patience_across_a_change():
    growth_cases.check_early_stopping_keeps_its_patience()


def test_a_csv_logger_writes_one_file_across_changes(tmp_path):
    growth_cases.check_csv_logger_writes_one_file(tmp_path / "log.csv")


def test_an_error_in_a_later_segment_leaves_the_callbacks_as_they_were():
    growth_cases.check_an_error_leaves_the_callbacks_as_they_were()


def test_the_learning_rate_follows_the_batch_and_is_put_back(monkeypatch):
    growth_cases.check_the_learning_rate_follows_the_batch(monkeypatch)


def test_a_kept_batch_trains_model_fit_s_weights(monkeypatch):
    growth_cases.check_a_kept_batch_trains_model_fit_s_weights(monkeypatch)


def test_the_batch_joins_the_steps_first_move(monkeypatch):
    growth_cases.check_the_batch_joins_the_steps_first_move(monkeypatch)


def test_a_real_run_records_its_batch_and_noise_scale_each_epoch():
    growth_cases.check_a_real_run_grows_or_says_why()


def test_a_change_whose_first_step_fails_is_undone_with_one_warning():
    growth_cases.check_a_change_whose_first_step_fails_is_undone_with_one_warning()


class _Fits32(keras.layers.Layer):
    """Fails to compile a step over 32 samples: on JAX the trace sees the
    batch's size, and Keras's fit has emptied the model's variables by
    then (the state the step takes)."""

    def call(self, x):
        if x.shape[0] is not None and x.shape[0] > 32:
            raise MemoryError("the seam: a batch over 32 does not fit")
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


def test_a_grown_batch_that_fails_to_compile_goes_back_with_the_weights(monkeypatch):
    """The real lever, its decision forced to 64: the step at 64 fails
    inside Keras's JAX fit, whose variables are then empty; they are put
    back, the learning rate is back at yours, the run trains on at 32 and
    says so once."""
    import warnings

    import numpy as np

    import kerascale
    from kerascale.errors import KerascaleWarning

    growth_cases.forced(monkeypatch, {0: 64})
    x, y = growth_cases.data(samples=2048)
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((8,)),
            _Fits32(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    m.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(
            m,
            x,
            y,
            epochs=4,
            verbose=0,
            precision="float32",
            steps_per_execution=1,
            **growth_cases.ONE,
        )
    said = [str(w.message) for w in caught if w.category is KerascaleWarning]
    assert len(said) == 1 and "Not applied: batch 64" in said[0]
    assert "MemoryError" in said[0] and "at batch 32" in said[0]
    assert history.history["batch_size"] == [32, 32, 32, 32]
    assert all(np.isfinite(w).all() for w in m.get_weights())
    rate = float(keras.ops.convert_to_numpy(m.optimizer.learning_rate))
    np.testing.assert_allclose(rate, 1e-3, rtol=1e-6)
    assert m.predict(x[:4], verbose=0).shape == (4, 1)


def test_a_noise_scale_that_cannot_be_measured_drops_growth_with_one_warning(
    monkeypatch,
):
    growth_cases.check_a_noise_scale_that_cannot_be_measured_drops_growth_with_one_warning(
        monkeypatch
    )


def test_a_run_too_short_to_repay_a_compile_measures_nothing(monkeypatch):
    growth_cases.check_a_run_too_short_to_repay_a_compile_measures_nothing(monkeypatch)


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices")
def test_the_replicas_of_one_process_grow_and_a_strategy_s_keep_the_batch():
    """2 devices of this process (data_parallel) grow the batch as one; the
    replicas of a tf.distribute strategy (the same plan on TensorFlow) and
    a sharded model keep it, and say why."""
    import dataclasses

    import kerascale
    from kerascale.apply import batch_growth
    from kerascale.sense import data_facts, hardware

    x, y = growth_cases.data(samples=4096)
    fixed = {"epochs": 5, "verbose": 0, "precision": "float32"}
    m = growth_cases.model()
    plan = kerascale.plan(m, x, y, **fixed)
    assert plan.replicas == 2
    assert plan.reasons["batch_growth"].code == "growth.in_run"

    def why(**changes):
        facts = batch_growth.Facts(
            model=m,
            batch_size="auto",
            max_batch_size=None,
            data=data_facts.inspect(x, y),
            hardware=hardware.detect_hardware(),
            plan=dataclasses.replace(plan, **changes),
            clustered=False,
            fit_kwargs=fixed,
        )
        return batch_growth.reason(facts)

    assert why().code == "growth.in_run"
    assert "tf.distribute" in why(backend="tensorflow")
    assert "shards the model" in why(strategy="model_parallel")


def test_a_lever_that_fails_is_dropped_and_the_run_goes_on():
    growth_cases.check_a_lever_that_fails_is_dropped_and_the_run_goes_on()


@pytest.mark.nightly
def test_two_levers_change_one_segment_and_undo_together():
    growth_cases.check_two_levers_change_one_segment()


# On keras-nightly too: Keras 3.16 seeds an epoch's shuffle from its adapter
# (a new fit would start it over: the controller carries it on).
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
        monkeypatch, tmp_path, "jax"
    )


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices (jax_2dev)")
def test_two_devices_grow_the_global_batch_as_one_device_trains_it(monkeypatch):
    """The devices of one process grow the batch as one: 2 replicas of 32
    (global 64) -> 2 of 64 at epoch 2, with the rate x sqrt(2), train as one
    device trains 64 then 128 at that rate (Keras's own fits, by hand)."""
    growth_cases.check_two_devices_grow_as_one(monkeypatch)
