"""Gradient accumulation: the split, the effective-batch contract, schedules
counted per update, learning-rate scaling, the partial window, BatchNorm."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CPU, gpu_box

import kerascale
from kerascale.apply import accumulation
from kerascale.errors import ConfigurationError, ModelError
from kerascale.measure.result import ProbeResult
from kerascale.plan import accumulation as accumulation_rules
from kerascale.plan.options import Options
from kerascale.plan.rules import make_plan
from kerascale.sense import hardware
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts

CPU_ONLY = Hardware(cpu=CPU)


def regression_model(optimizer, *, seed=3, batchnorm=False):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(16, activation="tanh", name="hidden")(inputs)
    if batchnorm:
        h = keras.layers.BatchNormalization(momentum=0.9, name="bn")(h)
    outputs = keras.layers.Dense(2, name="out")(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def twin_of(model, optimizer):
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    twin.compile(optimizer=optimizer, loss="mse")
    return twin


def data(n=128, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = np.stack([x[:, 0] * 2 - x[:, 1], np.sin(x[:, 2])], axis=1).astype("float32")
    return x, y


def max_diff(a, b):
    return max(
        float(np.max(np.abs(u - v)))
        for u, v in zip(a.get_weights(), b.get_weights(), strict=True)
    )


def accumulated_fit(model, x, y, *, batch_size=32, accumulation_steps=4, **kwargs):
    """kerascale.fit on arrays, in order, float32, quiet: as the twin trains."""
    kwargs = {
        "epochs": 1,
        "shuffle": False,
        "verbose": 0,
        "precision": "float32",
    } | kwargs
    return kerascale.fit(
        model,
        x,
        y,
        batch_size=batch_size,
        accumulation_steps=accumulation_steps,
        **kwargs,
    )


# --- The split, pure ---------------------------------------------------------------


@pytest.mark.parametrize(
    "per_replica, max_micro, expected",
    [
        (512, 512, (512, 1, True)),
        (512, None, (512, 1, True)),
        (1024, 512, (512, 2, True)),
        (1000, 300, (250, 4, True)),
        (512, 100, (64, 8, True)),  # 6 and 7 do not divide 512
        (48, 7, (6, 8, True)),
        (1009, 512, (504, 2, False)),  # prime: no exact split that fills
        (7, 1, (1, 7, True)),
    ],
)
def test_split_table(per_replica, max_micro, expected):
    s = accumulation_rules.split(per_replica, max_micro)
    assert (s.micro, s.steps, s.exact) == expected
    assert s.micro <= (max_micro or per_replica)
    if s.exact:
        assert s.micro * s.steps == per_replica


@pytest.mark.parametrize(
    "batch, replicas, max_batch, expected",
    [
        # (global batch, replicas, max_batch_size (global), (micro, k, global))
        (256, 1, 256, (256, 1, 256)),
        (1024, 1, 256, (256, 4, 1024)),
        (1024, 4, 256, (64, 4, 1024)),
        (1000, 2, 200, (100, 5, 1000)),
        (96, 2, 14, (6, 8, 96)),
        (1018, 2, 600, (254, 2, 1016)),  # 509 per replica is prime
    ],
)
def test_plan_factorisation_table(batch, replicas, max_batch, expected):
    hw = gpu_box(replicas) if replicas > 1 else CPU_ONLY
    p = make_plan(
        hw,
        Options.validate(batch_size=batch, max_batch_size=max_batch),
        ModelFacts(policy="float32"),
        DataFacts(kind="arrays", num_samples=10_000),
    )
    assert p.replicas == replicas
    assert (p.micro_batch_size, p.accumulation_steps, p.global_batch_size) == expected
    assert p.micro_batch_size * p.replicas * p.accumulation_steps == (
        p.global_batch_size
    )
    if p.accumulation_steps > 1:
        assert p.reasons["accumulation_steps"].details["note"] == "max_batch_size bound"
        assert f"x {p.accumulation_steps} = {p.global_batch_size}" in str(p)


def test_an_inexact_split_is_said_loudly_with_the_exact_alternatives():
    p = make_plan(
        CPU_ONLY,
        Options.validate(batch_size=1009, max_batch_size=512),
        ModelFacts(policy="float32"),
        DataFacts(kind="arrays", num_samples=10_000),
    )
    assert p.global_batch_size == 1008
    (w,) = [w for w in p.warnings if "cannot be reached exactly" in w]
    assert "batch_size=1009" in w and "1008 samples per update" in w
    assert "pass batch_size=1008 or 1010" in w


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 64, "accumulation_steps": True}, "accumulation_steps=True"),
        ({"batch_size": 64, "accumulation_steps": 0}, "accumulation_steps=0"),
        ({"batch_size": 64, "accumulation_steps": "2"}, "accumulation_steps='2'"),
        ({"batch_size": 64, "accumulation_steps": 3}, "accumulation_steps=3"),
        ({"accumulation_steps": 2}, 'batch_size="auto"'),
        ({"batch_size": 64, "lr_scaling": "cubic"}, "lr_scaling='cubic'"),
        ({"batch_size": 64, "lr_scaling": "linear"}, "base_batch_size=None"),
        ({"batch_size": 64, "base_batch_size": -1}, "base_batch_size=-1"),
        ({"batch_size": 64, "max_batch_size": 0}, "max_batch_size=0"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    x, y = data(64)
    with pytest.raises(ConfigurationError, match=match):
        kerascale.plan(regression_model("sgd"), x, y, verbose=0, **kwargs)


def test_batch_not_divisible_by_replicas_names_batch_size():
    with pytest.raises(ConfigurationError, match="batch_size=30"):
        make_plan(
            gpu_box(4),
            Options.validate(batch_size=30, max_batch_size=8),
            ModelFacts(policy="float32"),
            DataFacts(kind="arrays", num_samples=1000),
        )


def test_pydataset_cannot_be_split():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return data(16, seed=i)

    with pytest.raises(ConfigurationError, match="PyDataset"):
        kerascale.plan(
            regression_model("sgd"),
            Batches(),
            batch_size=16,
            accumulation_steps=2,
            verbose=0,
        )


@pytest.mark.parametrize(
    "scaling, factor", [("linear", 4.0), ("sqrt", 2.0), (None, 1.0)]
)
def test_lr_scaling_factor_in_the_plan(scaling, factor):
    x, y = data(512)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    p = kerascale.plan(
        regression_model("sgd"), ds, batch_size=128, lr_scaling=scaling, verbose=0
    )
    assert p.lr_factor == pytest.approx(factor)
    if scaling:
        why = p.reasons["lr_factor"]
        assert why.code == "lr.scaled"
        assert (why.details["effective"], why.details["base"]) == (128, 32)
        assert why.details["where"] == "your dataset's batch"
        assert "lr factor" in str(p)


# --- The effective-batch contract, trained for real ----------------------------------


@pytest.mark.parametrize(
    "make_opt",
    [lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(0.01)],
    ids=["sgd", "adam"],
)
@pytest.mark.parametrize("as_dataset", [False, True], ids=["arrays", "dataset"])
def test_k_micro_steps_equal_one_step_of_k_times_b(make_opt, as_dataset):
    x, y = data(128)
    model = regression_model(make_opt())
    twin = twin_of(model, make_opt())
    if as_dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        h = kerascale.fit(
            model,
            ds,
            batch_size=32,
            accumulation_steps=4,
            epochs=2,
            verbose=0,
            precision="float32",
        )
    else:
        h = accumulated_fit(model, x, y, epochs=2)
    twin.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    p = h.plan
    assert (p.micro_batch_size, p.accumulation_steps, p.global_batch_size) == (8, 4, 32)
    assert max_diff(model, twin) < 1e-5
    assert max_diff(model, regression_model(make_opt())) > 1e-3  # it trained
    # The user's optimizer is left as it was, counting updates.
    assert model.optimizer.gradient_accumulation_steps is None
    assert int(model.optimizer.iterations.numpy()) == 8


def test_mixed_float16_loss_scaling_with_accumulation():
    x, y = data(128)
    model = regression_model(keras.optimizers.SGD(0.1))
    h = accumulated_fit(model, x, y, precision="mixed_float16")
    assert h.plan.precision == "mixed_float16" and not h.plan.rebuild  # in place
    keras.config.set_dtype_policy("mixed_float16")
    try:
        twin = twin_of(regression_model(keras.optimizers.SGD(0.1)), "sgd")
    finally:
        keras.config.set_dtype_policy("float32")
    twin.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert isinstance(twin.optimizer, keras.optimizers.LossScaleOptimizer)
    twin.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    # float16 activations: agreement to half-precision tolerance.
    for a, b in zip(model.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=5e-3)
    assert max_diff(model, regression_model("sgd")) > 1e-2


def test_schedules_advance_once_per_update_and_stay_the_users():
    x, y = data(128)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.2, 1, 0.5)
    config = schedule.get_config()
    model = regression_model(keras.optimizers.SGD(schedule))
    twin = twin_of(
        model,
        keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.2, 1, 0.5)),
    )
    accumulated_fit(model, x, y)
    twin.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    # lr halves per update: counted per micro-step, the 4 updates would have
    # used 0.2 x 0.5^(0, 4, 8, 12) and the weights would differ.
    assert max_diff(model, twin) < 1e-5
    assert model.optimizer._learning_rate is schedule  # the user's own object
    assert schedule.get_config() == config
    assert float(model.optimizer.learning_rate) == pytest.approx(0.2 * 0.5**4)


def test_per_update_schedule_counts_and_serialises():
    base = keras.optimizers.schedules.PiecewiseConstantDecay([2], [1.0, 0.1])
    s = accumulation.PerUpdate(base, steps=4, factor=2.0)
    assert [float(s(i)) for i in (0, 7, 11, 12)] == pytest.approx([2, 2, 2, 0.2])
    back = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(s))
    assert isinstance(back, accumulation.PerUpdate)
    assert [float(back(i)) for i in (0, 12)] == pytest.approx([2, 0.2])


def test_lr_scaling_applies_to_a_float_learning_rate_and_is_undone():
    x, y = data(128)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = regression_model(keras.optimizers.SGD(0.05))
    twin = twin_of(model, keras.optimizers.SGD(0.2))
    h = kerascale.fit(
        model,
        ds,
        batch_size=64,
        lr_scaling="linear",
        epochs=1,
        verbose=0,
        precision="float32",
    )
    twin.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    assert h.plan.lr_factor == 4.0
    assert max_diff(model, twin) < 1e-5  # trained at 0.05 x 4
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)


def test_a_partial_last_window_is_dropped_and_said():
    x, y = data(80)  # 10 micro-batches of 8; windows of 4: 2 updates, 2 left
    model = regression_model(keras.optimizers.SGD(0.1))
    twin = twin_of(model, keras.optimizers.SGD(0.1))
    with pytest.warns(kerascale.KerascaleWarning) as said:
        accumulated_fit(model, x, y)
    twin.fit(x[:64], y[:64], batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert max_diff(model, twin) < 1e-5
    assert any("2 micro-batch(es) into a window of 4" in str(w.message) for w in said)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_windows_run_across_epoch_boundaries():
    x, y = data(48)  # 6 micro-batches of 8 per epoch; windows of 4
    model = regression_model(keras.optimizers.SGD(0.1))
    twin = twin_of(model, keras.optimizers.SGD(0.1))
    accumulated_fit(model, x, y, epochs=2)
    # 12 micro-batches = 3 updates: samples 0-31, 32-47 + 0-15, 16-47.
    xx, yy = np.concatenate([x, x]), np.concatenate([y, y])
    twin.fit(xx, yy, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert max_diff(model, twin) < 1e-5


def test_batchnorm_sees_each_micro_batch():
    """The documented caveat: BatchNorm normalises each micro-batch with its
    own statistics and moves its moving mean once per micro-batch."""
    x, y = data(16)
    model = regression_model(keras.optimizers.SGD(0.0), batchnorm=True)
    twin = twin_of(model, keras.optimizers.SGD(0.0))
    accumulated_fit(model, x, y, batch_size=16, accumulation_steps=2)
    twin.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    hidden = keras.Model(twin.input, twin.get_layer("hidden").output)
    a, b = hidden(x[:8]).numpy().mean(0), hidden(x[8:]).numpy().mean(0)
    expected = 0.9 * (0.1 * a) + 0.1 * b  # two updates, momentum 0.9, from 0
    moving = model.get_layer("bn").moving_mean.numpy()
    np.testing.assert_allclose(moving, expected, atol=1e-5)
    one_batch = twin.get_layer("bn").moving_mean.numpy()
    np.testing.assert_allclose(one_batch, 0.1 * hidden(x).numpy().mean(0), atol=1e-5)
    assert not np.allclose(moving, one_batch, atol=1e-4)


# --- accumulate() for plain model.fit -------------------------------------------------


def test_accumulate_for_plain_model_fit():
    x, y = data(128)
    model = regression_model(keras.optimizers.Adam(0.01))
    model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)  # already built
    twin = twin_of(model, keras.optimizers.Adam(0.01))
    twin.optimizer.build(twin.trainable_variables)
    for a, b in zip(model.optimizer.variables, twin.optimizer.variables, strict=True):
        b.assign(a)
    assert kerascale.accumulate(model, 4) is model
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    twin.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert max_diff(model, twin) < 1e-5
    assert int(model.optimizer.iterations.numpy()) == int(twin.optimizer.iterations)


@pytest.mark.parametrize(
    "steps, match", [(True, "steps=True"), (0, "steps=0"), (2.0, "steps=2.0")]
)
def test_accumulate_validates(steps, match):
    with pytest.raises(ConfigurationError, match=match):
        kerascale.accumulate(regression_model("sgd"), steps)
    with pytest.raises(ConfigurationError, match="lr_factor=0"):
        kerascale.accumulate(regression_model("sgd"), 2, lr_factor=0)


def test_accumulate_needs_a_compiled_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ModelError, match="compile"):
        kerascale.accumulate(model, 2)


# --- Where the micro-batch bound comes from: measured, through the seam ------------


class ThresholdProber:
    """Batches up to T per replica fit, ACCUMULATORS fewer when a probe
    holds gradient accumulators; records each probe and its spec."""

    calls: list = []
    ACCUMULATORS = 0

    def __init__(self, model, spec, **kwargs):
        self.spec = spec

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def __call__(self, b):
        k = self.spec.accumulation_steps
        ThresholdProber.calls.append((b, k))
        if b <= ThresholdProber.T - (ThresholdProber.ACCUMULATORS if k > 1 else 0):
            return ProbeResult(b, "ok", peak_bytes=(1 << 30) + b * (1 << 20))
        return ProbeResult(b, "oom", message="ResourceExhaustedError: OOM")

    def sweep(self, batches):
        out = []
        for b in batches:
            out.append(self(b))
            if out[-1].outcome != "ok":
                break
        return out

    def baseline_bytes(self):
        return None


@pytest.fixture
def gpu_seam(monkeypatch):
    from kerascale.measure import probe

    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: gpu_box(1))
    # On a GPU the probes run in this process (its allocator is training's).
    monkeypatch.setattr(probe, "InProcessProber", ThresholdProber)
    ThresholdProber.calls, ThresholdProber.ACCUMULATORS = [], 0
    return ThresholdProber


def test_a_batch_that_fits_costs_one_probe(gpu_seam):
    gpu_seam.T = 500
    x, y = data(4096)
    p = kerascale.plan(regression_model("sgd"), x, y, batch_size=256, verbose=0)
    assert (p.micro_batch_size, p.accumulation_steps) == (256, 1)
    assert gpu_seam.calls == [(256, 1)]  # alone: it needs no accumulators


def test_a_batch_that_fits_only_without_accumulators_is_not_split(gpu_seam):
    """256 fits in one pass, but not beside accumulators: it needs none, so
    it trains unsplit (it was split into 2 x 128 before)."""
    gpu_seam.T, gpu_seam.ACCUMULATORS = 300, 100
    x, y = data(4096)
    p = kerascale.plan(regression_model("sgd"), x, y, batch_size=256, verbose=0)
    assert (p.micro_batch_size, p.accumulation_steps) == (256, 1)
    assert gpu_seam.calls == [(256, 1)]


def test_a_batch_that_does_not_fit_is_accumulated(gpu_seam):
    gpu_seam.T = 100
    x, y = data(4096)
    model = regression_model("sgd")
    p = kerascale.plan(model, x, y, batch_size=1024, verbose=0)
    # Largest fitting 96 (granularity 8), less the 3% margin: 88; 1024 / 88
    # needs 12 micro-batches; 12 does not divide 1024, 16 does: 64.
    assert (p.micro_batch_size, p.accumulation_steps, p.global_batch_size) == (
        64,
        16,
        1024,
    )
    assert p.reasons["accumulation_steps"].code == "accumulation.split"
    assert p.reasons["accumulation_steps"].details["note"] == "measured bound"
    assert gpu_seam.calls[0] == (1024, 1)  # alone, once: it does not fit
    assert all(k == 2 for _, k in gpu_seam.calls[1:])  # the split's bound
    assert (1024, 2) not in gpu_seam.calls  # not probed again
    # Cached: a second plan probes nothing.
    gpu_seam.calls.clear()
    again = kerascale.plan(model, x, y, batch_size=1024, verbose=0)
    assert gpu_seam.calls == []
    # The same plan; only the recompute reason's timing of this run may move
    # (the weighing is not worth it here, and it says so with its estimate).
    assert {p.reasons["recompute"].code, again.reasons["recompute"].code} == {
        "recompute.not_weighed"
    }
    assert untimed(again) == untimed(p)


def untimed(plan):
    return dataclasses.replace(plan, reasons={**plan.reasons, "recompute": ""})


def test_no_check_on_a_cpu_without_memory_limit(monkeypatch):
    from kerascale.measure import child, probe

    def boom(*a, **k):
        raise AssertionError("no probe expected")

    monkeypatch.setattr(child, "IsolatedProber", boom)
    monkeypatch.setattr(probe, "InProcessProber", boom)
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: CPU_ONLY)
    x, y = data(4096)
    p = kerascale.plan(regression_model("sgd"), x, y, batch_size=2048, verbose=0)
    assert (p.micro_batch_size, p.accumulation_steps) == (2048, 1)
    assert p.reasons["accumulation_steps"].code == "accumulation.no_bound"
