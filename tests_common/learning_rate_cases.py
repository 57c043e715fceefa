"""`ScaledLearningRate`'s checks that both backends' suites run
(tests/test_scaled_learning_rate.py, tests_jax/test_jax_goodput.py): the
rate each optimizer family trains at, and the rate put back however `fit`
ends."""

import keras
import numpy as np
import pytest
from growth_cases import StopAfter

import kerascale
from kerascale.callbacks import ScaledLearningRate


def data(samples=256):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1))).astype("float32")
    return x, y


def model(optimizer):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile(optimizer, "mse")
    return m


class Rates(keras.callbacks.Callback):
    """The learning rate each epoch trained at (read at its end)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(self.model.optimizer.learning_rate))


def trained_rates(optimizer, epochs, *, before=(), after=(), **scale):
    m = model(optimizer)
    rates = Rates()
    x, y = data()
    scaler = ScaledLearningRate(128, verbose=0, **scale)
    m.fit(
        x,
        y,
        batch_size=128,
        epochs=epochs,
        verbose=0,
        callbacks=[*before, scaler, *after, rates],
    )
    return m, rates.seen


def check_adam_takes_the_square_root_and_gets_its_rate_back():
    m, seen = trained_rates(keras.optimizers.Adam(1e-3), 3)
    assert seen == pytest.approx([2e-3] * 3)  # sqrt(128 / 32) = 2
    assert float(m.optimizer.learning_rate) == pytest.approx(1e-3)


def check_sgd_scales_linearly_over_its_warmup():
    m, seen = trained_rates(keras.optimizers.SGD(0.01), 4, warmup_epochs=2)
    # 128 / 32 = 4, reached over 2 epochs: x1, x2.5, x4, x4.
    assert seen == pytest.approx([0.01, 0.025, 0.04, 0.04])
    assert float(m.optimizer.learning_rate) == pytest.approx(0.01)


def check_reduce_on_plateau_acts_on_the_scaled_rate_and_stays():
    """ReduceLROnPlateau halves the rate each epoch (patience 0 and a
    monitor that never improves): after the warmup it acts on the scaled
    rate, and what it did is kept when the factor is divided out."""

    class Worse(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["worse"] = float(epoch)

    reduce = keras.callbacks.ReduceLROnPlateau(
        monitor="worse", mode="min", factor=0.5, patience=0, verbose=0
    )
    m, seen = trained_rates(keras.optimizers.Adam(1e-3), 3, after=[Worse(), reduce])
    # Epoch 0 sets the best; epochs 1 and 2 do not improve, each halving
    # the rate from the end of that epoch (Rates reads it after).
    assert seen == pytest.approx([2e-3, 1e-3, 5e-4])
    assert float(m.optimizer.learning_rate) == pytest.approx(2.5e-4)


def check_no_rule_or_a_schedule_leaves_the_rate_with_a_warning():
    with pytest.warns(UserWarning, match="no rule is known.*Lion"):
        _, seen = trained_rates(keras.optimizers.Lion(1e-4), 2)
    assert seen == pytest.approx([1e-4, 1e-4])
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 1000, 0.5)
    with pytest.warns(UserWarning, match="schedule or a function"):
        trained_rates(keras.optimizers.Adam(schedule), 1)


def check_a_fit_that_raises_gets_its_rate_back():
    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("boom")

    m = model(keras.optimizers.Adam(1e-3))
    x, y = data()
    with pytest.raises(RuntimeError, match="boom"):
        kerascale.fit(
            m,
            x,
            y,
            batch_size=128,
            epochs=2,
            verbose=0,
            callbacks=[ScaledLearningRate(128, verbose=0), Boom()],
        )
    assert float(m.optimizer.learning_rate) == pytest.approx(1e-3)


def check_a_resume_restores_the_scaled_rate_not_its_square(tmp_path):
    """Keras's BackupAndRestore after it in `callbacks`: the resumed run
    trains at the rate saved (scaled once), and the rate is yours after."""

    class StopAt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("preempted")

    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    with pytest.raises(RuntimeError, match="preempted"):
        trained_rates(keras.optimizers.Adam(1e-3), 4, after=[backup, StopAt()])
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    m, seen = trained_rates(keras.optimizers.Adam(1e-3), 4, after=[backup])
    assert seen == pytest.approx([2e-3, 2e-3])  # epochs 2 and 3
    assert float(m.optimizer.learning_rate) == pytest.approx(1e-3)


def halving(epoch, rate):
    return 1e-2 * 0.5**epoch


def _checkpointed(directory, *extra, rate=1e-2):
    m = model(keras.optimizers.Adam(rate))
    x, y = data()
    kerascale.fit(
        m,
        x,
        y,
        batch_size=32,
        epochs=4,
        verbose=0,
        precision="float32",
        steps_per_execution=1,
        checkpoint_dir=str(directory),
        callbacks=[keras.callbacks.LearningRateScheduler(halving), *extra],
    )
    return m


def check_a_run_whose_rate_a_callback_moved_resumes(tmp_path):
    """The checkpoints of a run whose learning rate a callback moved (here a
    schedule by the epoch; a `ReduceLROnPlateau` or kerascale's batch rule
    alike) resume: a checkpoint records the rate its run started at, not the
    rate at the save (which it restores). They raised "written by a
    different configuration" before. A run whose own starting rate differs
    is still told so."""
    reference = _checkpointed(tmp_path / "straight")
    with pytest.raises(RuntimeError, match="interrupted"):
        _checkpointed(tmp_path / "run", StopAfter(2))
    resumed = _checkpointed(tmp_path / "run")
    for a, b in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    rate = float(resumed.optimizer.learning_rate)
    assert rate == float(reference.optimizer.learning_rate) == pytest.approx(1.25e-3)
    started = r"learning_rate \(the rate the run started at\)"
    with pytest.raises(kerascale.CheckpointError, match=started):
        _checkpointed(tmp_path / "run", rate=1e-3)
