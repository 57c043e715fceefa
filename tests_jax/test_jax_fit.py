"""kerascale.fit on Keras's JAX backend: the same door, keras.distribution
underneath, no TensorFlow, and the model left as it was."""

import re
import sys
import time
import warnings

import broken_step
import jax
import keras
import numpy as np
import pytest
import xla_flags
from conftest import dense_model, devices, toy_data

import kerascale
from kerascale.sense import backend as backend_lib
from kerascale.sense.hardware import STAND_IN_VARIABLE

TF_WORDS = ("tf.distribute", "TensorFlow", "Mirrored", "OneDevice", "MultiWorker")


def _plain_fit(build, x, y, distribution, **kwargs):
    """What a competent JAX user writes, as Keras's guide says: the
    distribution set, then the model built, then fit."""
    keras.distribution.set_distribution(distribution)
    try:
        model = build()
        return model, model.fit(x, y, verbose=0, **kwargs)
    finally:
        keras.distribution.set_distribution(None)


def test_imports_and_trains_without_tensorflow(monkeypatch):
    import attempts as attempts_lib

    x, y = toy_data()
    model = dense_model()
    attempts = attempts_lib.record(monkeypatch)
    history = kerascale.fit(model, x, y, epochs=1, batch_size=16, verbose=0)
    assert history.plan.backend == "jax"
    assert "tensorflow" not in sys.modules
    attempts.check(1)  # decided once, from the ladder (test_jax_ladder.py)


def test_plan_names_the_backend_and_no_tf_distribute_strategy():
    x, y = toy_data()
    plan = kerascale.plan(dense_model(), x, y, batch_size=16, verbose=0)
    text = plan.describe()
    assert plan.backend == "jax" and "keras.distribution" in text
    # Each reason at a glance (about 60 characters); explain() has them all.
    for line in text.splitlines()[1:]:
        row = re.split(r"\s{2,}", line.strip())
        assert len(row) < 3 or len(row[2]) <= 60, line
    assert plan.reasons["strategy"] in " ".join(plan.explain().split())  # wrapped
    assert not [w for w in TF_WORDS if w in text], text
    assert plan.replicas == devices()
    if devices() > 1:
        assert plan.strategy == "data_parallel"
        assert plan.reasons["strategy"].details["devices"] == devices()
    else:
        assert plan.strategy == "default"


@pytest.mark.skipif(devices() < 2, reason="needs 2 devices")
def test_cpu_devices_of_one_process_train_on_one_as_plain_fit_does(monkeypatch):
    # Not standing in for accelerators, the CPU devices share the cores: a
    # split trains no faster, so "auto" trains as plain fit does, on one.
    monkeypatch.delenv(STAND_IN_VARIABLE)
    x, y = toy_data(n=96)
    ours = dense_model(seed=3)
    history = kerascale.fit(
        ours, x, y, epochs=2, batch_size=32, shuffle=False, verbose=0
    )
    assert (history.plan.strategy, history.plan.replicas) == ("default", 1)
    assert history.plan.reasons["strategy"].code == "strategy.shared_cpu_devices"
    theirs = dense_model(seed=3)
    theirs.fit(x, y, epochs=2, batch_size=32, shuffle=False, verbose=0)
    for a, b in zip(ours.get_weights(), theirs.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    asked = kerascale.plan(
        dense_model(), x, y, batch_size=32, strategy="data_parallel", verbose=0
    )
    assert (asked.strategy, asked.replicas) == ("data_parallel", 2)


def test_training_equals_plain_fit_under_the_same_distribution():
    x, y = toy_data(n=96)
    ours = dense_model(seed=3)  # built outside any distribution
    history = kerascale.fit(
        ours, x, y, epochs=3, batch_size=32, shuffle=False, verbose=0
    )
    theirs, plain = _plain_fit(
        lambda: dense_model(seed=3),
        x,
        y,
        keras.distribution.DataParallel(devices=jax.local_devices())
        if devices() > 1
        else None,
        epochs=3,
        batch_size=32,
        shuffle=False,
    )
    np.testing.assert_allclose(
        history.history["loss"], plain.history["loss"], rtol=1e-6, atol=1e-6
    )
    for a, b in zip(ours.get_weights(), theirs.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_leaves_nothing_behind():
    """No distribution stays set, every variable is back on one device, the
    policy is float32 again; only the weights changed."""
    x, y = toy_data()
    model = dense_model(optimizer="adam", metrics=["accuracy"])
    before = [w.copy() for w in model.get_weights()]
    kerascale.fit(
        model, x, y, epochs=1, batch_size=16, precision="mixed_bfloat16", verbose=0
    )
    assert keras.distribution.distribution() is None
    variables = [*model.variables, *model.optimizer.variables]
    for v in variables:
        assert isinstance(v.value.sharding, jax.sharding.SingleDeviceSharding), v.path
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    assert any(
        not np.allclose(a, b) for a, b in zip(before, model.get_weights(), strict=True)
    )
    # and plain Keras trains it afterwards, as before
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)


def test_a_distribution_set_before_fit_wins_and_stays_set():
    x, y = toy_data()
    mine = keras.distribution.DataParallel(devices=jax.local_devices()[:1])
    keras.distribution.set_distribution(mine)
    model = dense_model()  # built under it, as Keras's guide says
    history = kerascale.fit(model, x, y, epochs=1, batch_size=16, verbose=0)
    assert history.plan.strategy == "DataParallel"
    assert history.plan.reasons["strategy"].code == "strategy.distribution_set"
    assert history.plan.replicas == 1
    assert keras.distribution.distribution() is mine


def test_precision_in_place_float32_outputs_and_put_back():
    x, y = toy_data()
    model = dense_model()
    seen = {}

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen["hidden"] = self.model.get_layer("hidden").dtype_policy.name
            seen["out"] = self.model.get_layer("out").dtype_policy.name

    history = kerascale.fit(
        model,
        x,
        y,
        epochs=1,
        batch_size=16,
        precision="mixed_bfloat16",
        callbacks=[Watch()],
        verbose=0,
    )
    assert history.plan.precision == "mixed_bfloat16"
    assert seen == {"hidden": "mixed_bfloat16", "out": "float32"}
    assert model.get_layer("hidden").dtype_policy.name == "float32"
    assert np.isfinite(history.history["loss"]).all()


def test_float16_trains_with_loss_scaling_and_keeps_the_optimizer():
    x, y = toy_data()
    model = dense_model()
    optimizer = model.optimizer
    seen = {}

    class Watch(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["optimizer"] = type(self.model.optimizer).__name__

    history = kerascale.fit(
        model,
        x,
        y,
        epochs=1,
        batch_size=16,
        precision="mixed_float16",
        callbacks=[Watch()],
        verbose=0,
    )
    assert seen["optimizer"] == "LossScaleOptimizer"
    assert model.optimizer is optimizer
    assert np.isfinite(history.history["loss"]).all()


def test_accumulation_equals_one_large_batch():
    """4 accumulated micro-batches of 16 (per update of 64) give the weights
    of one SGD step on 64 samples, on every device count."""
    x, y = toy_data(n=64)
    ours, theirs = dense_model(seed=5), dense_model(seed=5)
    history = kerascale.fit(
        ours,
        x,
        y,
        epochs=1,
        batch_size=64,
        accumulation_steps=4,
        shuffle=False,
        verbose=0,
    )
    assert history.plan.accumulation_steps == 4
    assert history.plan.global_batch_size == 64
    theirs.fit(x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    for a, b in zip(ours.get_weights(), theirs.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ours.optimizer.gradient_accumulation_steps is None


def test_pydataset_and_generator_train():
    x, y = toy_data()

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return x[i * 16 : (i + 1) * 16], y[i * 16 : (i + 1) * 16]

    def generator():
        for i in range(4):
            yield x[i * 16 : (i + 1) * 16], y[i * 16 : (i + 1) * 16]

    for data in (Batches(), generator()):
        history = kerascale.fit(dense_model(), data, epochs=1, verbose=0)
        assert history.plan.backend == "jax"
        assert np.isfinite(history.history["loss"]).all()


def test_grain_datasets_train_as_plain_fit_without_tensorflow(tmp_path):
    grain = pytest.importorskip("grain")
    x, y = toy_data()

    def source():
        return grain.MapDataset.source([(x[i], y[i]) for i in range(64)])

    distribution = keras.distribution.DataParallel() if devices() > 1 else None
    for data in (
        lambda: source().batch(16),
        lambda: source().batch(16).to_iter_dataset(),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = kerascale.fit(
                dense_model(seed=3),
                data(),
                epochs=2,
                verbose=0,
                checkpoint_dir=tmp_path / type(data()).__name__,
            )
        _, theirs = _plain_fit(
            lambda: dense_model(seed=3), data(), None, distribution, epochs=2
        )
        np.testing.assert_allclose(
            ours.history["loss"], theirs.history["loss"], rtol=1e-6
        )
        said = _kerascale_warnings(caught)
        assert len(said) == 1 and "cannot be read ahead" in said[0], said
        assert "tf.data" not in said[0], said[0]
        # kerascale's own reads of Keras variables stay quiet under NumPy 2.
        noisy = [w for w in caught if "__array__" in str(w.message)]
        assert not noisy, [(w.filename, w.lineno) for w in noisy]
    assert "tensorflow" not in sys.modules


def test_checkpoint_dir_checkpoints_without_a_warning(tmp_path):
    x, y = toy_data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kerascale.fit(
            dense_model(),
            x,
            y,
            epochs=1,
            batch_size=16,
            checkpoint_dir=tmp_path / "ckpt",
            verbose=0,
        )
    ours = [w for w in caught if issubclass(w.category, kerascale.KerascaleWarning)]
    assert not ours, [str(w.message) for w in ours]
    assert (tmp_path / "ckpt" / "ckpt-00000001" / "state.npz").is_file()


@pytest.mark.skipif(devices() < 2, reason="one device: nothing is laid out")
def test_a_model_that_cannot_be_laid_out_trains_on_one_device_with_one_warning(
    monkeypatch,
):
    from kerascale import _keras_compat as keras_compat

    real = keras_compat.lay_out

    class FailsOnTheSecond:
        """The run's distribution, until its second variable's layout fails
        (as a change in Keras's layouts would): nothing may stay laid out."""

        def __init__(self, distribution):
            self.distribution, self.calls = distribution, 0

        def get_variable_layout(self, variable):
            self.calls += 1
            if self.calls == 2:
                raise ValueError("no layout for this variable (the seam)")
            return self.distribution.get_variable_layout(variable)

    def half_then_fails(model, distribution):
        return real(model, FailsOnTheSecond(distribution))

    monkeypatch.setattr(keras_compat, "lay_out", half_then_fails)
    x, y = toy_data()
    model = dense_model(seed=3)
    import attempts as attempts_lib

    attempts = attempts_lib.record(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(model, x, y, epochs=2, batch_size=16, verbose=0)
    # The ladder's "place" rung: decided again, once, from the door.
    attempts.check(2)
    said = _kerascale_warnings(caught)
    assert len(said) == 1 and "Not applied: strategy data_parallel" in said[0], said
    assert "could not be laid out over 2 devices" in said[0]
    assert history.plan.replicas == 1 and history.plan.strategy == "default"
    plain = dense_model(seed=3)
    expected = plain.fit(x, y, epochs=2, batch_size=16, verbose=0)
    np.testing.assert_allclose(
        history.history["loss"], expected.history["loss"], rtol=1e-6
    )
    assert all(v._layout is None for v in model.variables)


def test_tensorflow_strategy_names_are_refused_with_the_jax_choices():
    x, y = toy_data()
    with pytest.raises(kerascale.ConfigurationError, match="data_parallel"):
        kerascale.fit(dense_model(), x, y, strategy="mirrored", verbose=0)


def test_find_batch_size_refuses_an_unsupported_backend(monkeypatch):
    monkeypatch.setattr(backend_lib, "name", lambda: "torch")
    x, y = toy_data()
    with pytest.raises(kerascale.UnsupportedError, match="batch_size"):
        kerascale.find_batch_size(dense_model(), x, y)


def test_an_unsupported_backend_trains_with_plain_fit_and_one_warning(monkeypatch):
    """torch, numpy, openvino: faked at the seam (no torch needed)."""
    monkeypatch.setattr(backend_lib, "name", lambda: "torch")
    x, y = toy_data()
    model = dense_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(
            model, x, y, epochs=2, batch_size=16, time_budget="1h", verbose=0
        )
    ours = [w for w in caught if issubclass(w.category, kerascale.KerascaleWarning)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "'torch'" in message and "plain model.fit" in message
    assert "time_budget='1h'" in message
    assert history.plan is None and len(history.history["loss"]) == 2


def test_plain_fit_before_and_after_in_float32():
    """Functions Keras traced before the run are not reused under the run's
    distribution, and are there again after it."""
    x, y = toy_data()
    model = dense_model()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    before = model.train_function
    kerascale.fit(model, x, y, epochs=1, batch_size=16, precision="float32", verbose=0)
    assert model.train_function is before
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)


def test_doctor_prints_the_jax_plan(capsys):
    from kerascale import cli

    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "backend:  jax" in out and "keras.distribution" in out
    assert not [w for w in TF_WORDS if w in out], out


@pytest.mark.once
def test_doctor_cluster_times_a_step_and_predicts_1_to_n_workers(tmp_path, capsys):
    from kerascale import cli

    path = str(tmp_path / "model.keras")
    dense_model(inputs=8).save(path)
    command = ["doctor", "--cluster", "4", path, "--input-shape", "8"]
    assert cli.main([*command, "--link", "gpu", "--accumulation", "2"]) == 0
    out = capsys.readouterr().out
    assert "one worker:" in out and "link gpu: 450 GB/s" in out
    rows = [line.split() for line in out.splitlines() if line[:7].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 4]
    assert float(rows[0][2]) == 0.0 and float(rows[2][2]) > float(rows[1][2])
    assert cli.main(["doctor", "--cluster", "4"]) == 2  # no model to time
    assert "times a training step" in capsys.readouterr().err


def _kerascale_warnings(caught):
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, kerascale.KerascaleWarning)
    ]


@pytest.mark.skipif(
    kerascale._tf.available(), reason="TensorFlow writes the files where installed"
)
def test_monitors_without_tensorflow_keep_figures_in_history(tmp_path):
    x, y = toy_data(n=256)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(
            dense_model(),
            x,
            y,
            epochs=2,
            batch_size=16,
            log_dir=tmp_path,
            profile=(2, 3),
            time_budget="1h",
            verbose=0,
        )
    said = _kerascale_warnings(caught)
    assert len(said) == 1, said
    assert "History only" in said[0]
    assert len(history.history["samples_per_second"]) == 2
    # The profile window is jax.profiler's, which needs no TensorFlow.
    traces = list((tmp_path / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_profile_window_on_jax_traces_its_steps_and_stops_when_fit_raises(tmp_path):
    from kerascale.callbacks.profile import JaxProfileWindow

    window = kerascale.callbacks.ProfileWindow(tmp_path / "a", 2, 3)
    assert isinstance(window, JaxProfileWindow)
    x, y = toy_data(n=256)
    dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[window])
    assert window.traced == (2, 3)

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("boom")

    raising = kerascale.callbacks.ProfileWindow(tmp_path / "b", 2, 8)
    with pytest.raises(RuntimeError, match="boom"):
        dense_model().fit(
            x, y, batch_size=16, epochs=1, verbose=0, callbacks=[raising, Boom()]
        )
    time.sleep(0.5)  # the fit-watch thread stops the trace within 0.2 s
    assert raising.traced == (2, 3)
    # The profiler is free again: a later window traces.
    again = kerascale.callbacks.ProfileWindow(tmp_path / "c", 1, 2)
    dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[again])
    assert again.traced == (1, 2)
    for name in "abc":
        assert list((tmp_path / name).glob("train/plugins/profile/*/*.xplane.pb"))


def test_callbacks_and_accumulate_in_a_plain_fit():
    x, y = toy_data(n=256)
    model = dense_model()
    kerascale.accumulate(model, 2)
    throughput = kerascale.callbacks.Throughput(batch_size=16)
    history = model.fit(
        x,
        y,
        epochs=1,
        batch_size=16,
        verbose=0,
        callbacks=[throughput, kerascale.callbacks.TimeBudget("1h")],
    )
    assert model.optimizer.gradient_accumulation_steps == 2
    assert history.history["loss"]
    assert throughput.epochs_seen[0]["samples_per_second"] > 0


def test_diagnose_on_an_unsupported_backend_says_so(monkeypatch):
    from kerascale.sense import backend as backend_lib

    monkeypatch.setattr(backend_lib, "name", lambda: "torch")
    x, y = toy_data()
    with pytest.raises(kerascale.UnsupportedError, match="Throughput"):
        kerascale.diagnose(dense_model(), x, y)


@pytest.mark.skipif(devices() > 1, reason="a laid-out run traces for its layout")
def test_a_second_kerascale_fit_in_float32_traces_nothing_again():
    """What Keras traced in a run that changed nothing is the model's own:
    the next call reuses it, as a second model.fit does (it used to be put
    back to None, and every call traced and compiled its step again)."""
    x, y = toy_data()
    model, seen = dense_model(), []

    class Peek(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(self.model.train_function)

    for _ in range(2):
        kerascale.fit(
            model,
            x,
            y,
            epochs=1,
            batch_size=16,
            precision="float32",
            verbose=0,
            callbacks=[Peek()],
        )
    assert seen[0] is seen[-1]
    assert model.train_function is seen[0]


class _BrokenStep(keras.Model):
    def train_step(self, state, data):
        raise ValueError(broken_step.MESSAGE)


@pytest.mark.parametrize("kind", broken_step.KINDS)
def test_a_broken_step_raises_as_plain_for_every_input(kind):
    """tests_common/broken_step.py: the retry holds its warnings until a
    step has run, whatever the input (on 2 devices too)."""
    broken_step.check(kind, _BrokenStep)


def test_the_trainer_pattern_trains_and_a_tensorflow_style_step_fails_as_plain():
    """keras.io's trainer pattern (a Model whose `train_step` trains another
    model): written for JAX it trains; written for TensorFlow (`train_step(self,
    data)`) it fails as plain `fit` fails, with the same error and no warning
    that blames kerascale's own choices."""

    class JaxTrainer(keras.Model):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def train_step(self, state, data):
            return super().train_step(state, data)

        def call(self, x):
            return self.model(x)

    class TfTrainer(JaxTrainer):
        def train_step(self, data):
            return {}

    x, y = toy_data(128)
    for trainer, fails in ((JaxTrainer, False), (TfTrainer, True)):
        keras.utils.set_random_seed(0)
        model = trainer(dense_model())
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if fails:
                plan = kerascale.plan(model, x, y, batch_size=16, verbose=0)
                assert plan.data_changes.pipeline  # a choice of kerascale's to drop
                plain = trainer(dense_model())
                plain.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
                with pytest.raises(TypeError, match="positional argument"):
                    plain.fit(x, y, batch_size=16, verbose=0)
                with pytest.raises(TypeError, match="positional argument"):
                    kerascale.fit(model, x, y, batch_size=16, verbose=0)
                # Keras's JAX fit left `plain`'s variables empty; kerascale
                # puts the model's back.
                assert model.predict(x[:4], verbose=0).shape == (4, 2)
            else:
                history = kerascale.fit(model, x, y, batch_size=16, epochs=2, verbose=0)
                assert len(history.history["loss"]) == 2
                assert int(model.optimizer.iterations) == 16
        assert not [w for w in caught if w.category is kerascale.KerascaleWarning]


@pytest.mark.once
def test_the_jax_guide_s_quickstart_runs_on_two_devices(tmp_path):
    """docs/jax.md's command: examples/quickstart_jax.py on 2 CPU devices,
    without TensorFlow (about 11 s), on a fresh machine (an empty cache):
    nothing on stderr (issue 55)."""
    import os
    import sys
    from pathlib import Path

    import start_up
    import stuck

    example = Path(__file__).resolve().parent.parent / "examples" / "quickstart_jax.py"
    env = {**os.environ, "XLA_FLAGS": xla_flags.forced_devices(2)}
    env["KERASCALE_CACHE_DIR"] = str(tmp_path / "cache")
    # A child that hangs is dumped (every thread's stack) before it is killed.
    # Issue 77's hang (CONTRIBUTING.md, "The known flake") is run again once,
    # its stacks kept as a warning in the lane's summary: a second hang fails.
    command = [sys.executable, str(example)]
    try:
        done = stuck.run(command, timeout=300, env=env)
    except stuck.Stuck as hung:
        import warnings

        warnings.warn(f"issue 77's hang, run again once: {hung}", stacklevel=1)
        done = stuck.run(command, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert start_up.said(done.stderr) == [], done.stderr[-3000:]
    assert "data_parallel (2 replicas)" in done.stdout, done.stdout[-2000:]
    accuracy = float(done.stdout.rsplit("test accuracy", 1)[1].split()[0])
    assert accuracy > 0.9, done.stdout[-2000:]


@pytest.mark.once
def test_doctor_without_a_backend_set_names_the_fix_and_the_fix_works(tmp_path):
    """Without TensorFlow and without KERAS_BACKEND, Keras starts on the
    backend its keras.json names, TensorFlow: `kerascale doctor` says so and
    names the fix, and the fix works (issue 55: a raw traceback)."""
    import json
    import os
    import shutil
    import subprocess

    home = tmp_path / "keras_home"
    home.mkdir()
    (home / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["KERAS_HOME"] = str(home)
    command = shutil.which("kerascale", path=os.path.dirname(sys.executable))
    done = subprocess.run(
        [command, "doctor"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "set KERAS_BACKEND=jax" in done.stderr, done.stderr
    assert str(home / "keras.json") in done.stderr
    fixed = subprocess.run(
        [command, "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "KERAS_BACKEND": "jax"},
    )
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "jax" in fixed.stdout


def test_the_door_speaks_keras_s_words_on_jax():
    """Issue 81 on JAX's trainer: a misspelt keyword and an `epochs` Keras
    cannot count fail first, as `model.fit` fails; batch_size=None is
    Keras's own batch; mismatched arrays say Keras's sentence."""
    x, y = toy_data(64)
    with pytest.raises(TypeError, match="did you mean 'validation_split'"):
        kerascale.fit(dense_model(), x, y, validaton_split=0.2)
    with pytest.raises(TypeError, match="'str' object cannot be interpreted"):
        kerascale.fit(dense_model(), x, y, epochs="3")
    with pytest.raises(kerascale.DataError, match=r"^Data cardinality is ambiguous"):
        kerascale.fit(dense_model(), x, y[:-1], verbose=0)
    history = kerascale.fit(dense_model(), x, y, batch_size=None, verbose=0)
    assert history.plan.global_batch_size == 32


class _Batches(keras.utils.PyDataset):
    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return len(self.x) // self.batch

    def __getitem__(self, i):
        s = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[s], self.y[s]


class _OwnFit(keras.Sequential):
    """A model class with its own fit (keras-hub's tasks have one)."""

    def fit(self, x=None, y=None, **kwargs):
        if y is not None and len(x) != len(y):
            raise ValueError("_OwnFit: x and y differ in length (its own words)")
        return super().fit(x, y, **kwargs)


def test_the_door_keeps_a_batched_input_and_a_models_own_fit_on_jax():
    """batch_size=0 with a `PyDataset` trains at its own batch, as Keras's
    fit does; a model class with its own `fit` keeps its own check and
    error, with one warning, where kerascale cannot plan for the data."""
    x, y = toy_data(64)
    history = kerascale.fit(dense_model(), _Batches(x, y, 16), batch_size=0, verbose=0)
    assert history.plan.global_batch_size == 16
    model = _OwnFit([keras.Input((x.shape[1],)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"^_OwnFit: x and y differ"):
            kerascale.fit(model, x, y[:-1], verbose=0)
    said = [str(w.message) for w in said if "own fit" in str(w.message)]
    assert len(said) == 1 and "_OwnFit has its own fit" in said[0], said
