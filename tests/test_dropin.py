"""Drop-in for real: models shaped like published Keras examples train through
`kerascale.fit` with every choice on "auto" (on this bf16 CPU, with unbatched
data, so that the batch search and the trials run) and end within noise of
plain `model.fit` at the same batch. Then one test per clause of the
contract: what is dropped and said, and Keras's meanings."""

import functools
import os
import subprocess
import sys
import textwrap
import warnings

import broken_step
import keras
import numpy as np
import pytest
import realworld
import tensorflow as tf

import kerascale
from kerascale.apply import model as model_lib
from kerascale.apply import precision as precision_lib
from kerascale.measure import cache
from kerascale.sense import data_signature

EPOCHS = 3
KINDS = [*realworld.ALL, "noisy"]


def make(kind):
    keras.utils.set_random_seed(0)  # the same initial weights for both runs
    if kind == "noisy":
        return realworld.make_noisy()
    return realworld.ALL[kind]()


def plain_fit(kind, batch):
    model, x, y, _ = make(kind)
    if isinstance(x, tf.data.Dataset):
        return model.fit(x.batch(batch), epochs=EPOCHS, verbose=0)
    if isinstance(x, keras.utils.PyDataset):
        return model.fit(x, epochs=EPOCHS, verbose=0)
    return model.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0)


@pytest.mark.parametrize("kind", KINDS)
def test_published_model_shapes_train_as_with_model_fit(kind):
    model, x, y, kwargs = make(kind)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        history = kerascale.fit(model, x, y, epochs=EPOCHS, verbose=0, **kwargs)
    plan = history.plan
    ours = history.history["loss"][-1]
    theirs = plain_fit(kind, plan.global_batch_size).history["loss"][-1]
    assert np.isfinite(ours)
    # Within noise: the same batch, and float32 or bf16 arithmetic.
    assert abs(ours - theirs) <= 0.1 * abs(theirs) + 1e-3, (ours, theirs)
    # Every step kerascale dropped is said once, as a KerascaleWarning.
    ours_said = [
        str(w.message) for w in said if w.category is kerascale.KerascaleWarning
    ]
    assert sorted(ours_said) == sorted(plan.warnings)
    assert len(set(ours_said)) == len(ours_said)


def test_a_gan_with_its_own_train_step_trains_as_it_is():
    model, x, _, _ = make("gan")
    # memory_limit: a CPU's "auto" batch (Keras's 32) would be checked by a
    # probe, which a model with its own train_step cannot run.
    with pytest.warns(kerascale.KerascaleWarning) as said:
        history = kerascale.fit(model, x, epochs=1, verbose=0, memory_limit="4GiB")
    texts = " ".join(str(w.message) for w in said)
    assert "not checked against memory" in texts, texts
    assert "its own train_step (GAN)" in texts, texts
    assert history.plan.global_batch_size == 32  # Keras's default
    assert not history.plan.rebuild and model.built
    # bf16 set in place, the generator's and discriminator's outputs float32
    # (what one model hands another), so the example's concat trains as is.
    assert "failed at the first" not in texts
    assert {layer.dtype_policy.name for layer in model.generator.layers} == {
        "float32"
    }  # put back


def test_a_choice_that_fails_at_the_first_step_is_tried_again_plain(bf16_cpu):
    """A PyDataset gets no precision trial: mixed_bfloat16 reaches the real
    run, fails at its first step, and the run goes on in float32."""
    model, x, y, _ = make("noisy")
    with pytest.warns(kerascale.KerascaleWarning, match="failed at the first") as w:
        history = kerascale.fit(model, realworld.Batches(x, y, 16), epochs=1, verbose=0)
    assert history.plan.precision == "float32"
    assert "Pass precision='float32' to skip the attempt" in str(w[0].message)
    assert history.plan.reasons["precision"].code == "first_step_failed"
    assert "does not match type bfloat16" in history.plan.reasons["precision"]
    assert int(model.optimizer.iterations) == 16
    # A failure that is the model's own, also in float32, is raised as is.
    broken = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    broken.compile("sgd", "mse")
    with pytest.raises(ValueError, match="incompatible"):
        kerascale.fit(
            broken, realworld.Batches(x, y, 16), precision="float32", verbose=0
        )


def test_a_retried_first_step_trains_every_batch_of_a_generator(bf16_cpu):
    """A generator cannot be rewound: the batches the failed bf16 attempt
    read are given again to the float32 retry, which trains on all of them,
    as plain `fit` does (it lost them before: fewer updates)."""
    updates, read = {}, {}
    for how in ("plain", "kerascale"):
        model, x, y, _ = make("noisy")
        read[how] = []

        def batches(seen=read[how], x=x, y=y):
            for i in range(0, 96, 16):
                seen.append(i)
                yield x[i : i + 16], y[i : i + 16]

        if how == "plain":
            model.fit(batches(), epochs=1, verbose=0)
        else:
            with pytest.warns(kerascale.KerascaleWarning, match="failed at the"):
                history = kerascale.fit(model, batches(), epochs=1, verbose=0)
            assert history.plan.precision == "float32"
        updates[how] = int(model.optimizer.iterations)
    assert updates["kerascale"] == updates["plain"]
    assert read["kerascale"] == read["plain"] == list(range(0, 96, 16))


def test_a_step_that_fails_on_its_own_raises_its_error_without_blaming_kerascale():
    """A train_step that fails whatever kerascale chose fails again in the
    plain retry: the user gets the error plain `fit` raises, and no warning
    that says kerascale's choice failed."""

    class Broken(keras.Model):
        def train_step(self, data):
            raise ValueError("my train_step is broken")

    inputs = keras.Input((4,))
    model = Broken(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(ValueError, match="my train_step is broken"):
        model.fit(ds, verbose=0)
    assert kerascale.plan(model, ds, verbose=0).data_changes.pipeline  # to drop
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="my train_step is broken"):
            kerascale.fit(model, ds, verbose=0)
    assert not [w for w in caught if w.category is kerascale.KerascaleWarning]


class _BrokenStep(keras.Model):
    def train_step(self, data):
        raise ValueError(broken_step.MESSAGE)


@pytest.mark.parametrize("kind", broken_step.KINDS)
def test_a_broken_step_raises_as_plain_for_every_input(kind):
    """tests_common/broken_step.py: the retry holds its warnings until a
    step has run, whatever the input."""
    broken_step.check(kind, _BrokenStep)


def test_a_failing_search_probe_is_tried_again_in_float32(no_budget, bf16_cpu):
    model, x, y, _ = make("noisy")
    # memory_limit: a CPU's "auto" batch (Keras's 32) is checked by a probe.
    history = kerascale.fit(model, x, y, epochs=1, verbose=0, memory_limit="4GiB")
    why = history.plan.reasons["precision"]
    assert why.startswith("float32: mixed_bfloat16 failed in the batch search")
    assert history.plan.reasons["global_batch_size"].code == "batch.searched"


def test_a_failing_trial_drops_its_candidate(monkeypatch, no_budget):
    from conftest import CPU_BF16

    from kerascale.measure import trial_bench
    from kerascale.sense import hardware

    bf16_host = hardware.Hardware(cpu=CPU_BF16)
    monkeypatch.setattr(hardware, "detect_hardware", lambda nvml=True: bf16_host)
    real = trial_bench.Prepared

    def bf16_breaks(session, given, data, plan, *, batch, policy, optimize):
        if policy == "mixed_bfloat16":
            raise tf.errors.InvalidArgumentError(None, None, "bfloat16 mismatch")
        return real(
            session, given, data, plan, batch=batch, policy=policy, optimize=optimize
        )

    monkeypatch.setattr(trial_bench, "Prepared", bf16_breaks)
    model, x, y, _ = make("loss_closure")
    p = kerascale.plan(model, x, y, batch_size=32, verbose=0)
    assert p.precision == "float32"
    assert "failed (InvalidArgumentError" in p.reasons["precision"]


# --- Dtypes ----------------------------------------------------------------------


def test_layers_pinned_by_the_user_keep_their_policy_and_outputs_are_float32():
    model, x, _, _ = make("pinned")
    undo = precision_lib.apply(model, "mixed_bfloat16")
    policies = {layer.name: layer.dtype_policy.name for layer in model.layers}
    assert policies["pinned"] == "float32" and policies["head"] == "float32"
    assert policies["dense"] == "mixed_bfloat16"
    assert model(x[:2]).dtype == tf.float32
    undo()
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}

    def build():
        inputs = keras.Input((6,))
        out = keras.layers.Dense(1)(keras.layers.Dense(4)(inputs))
        built = keras.Model(inputs, out)
        built.compile("sgd", "mse")
        return built

    built = model_lib.recreate(build, "mixed_bfloat16", tf.distribute.get_strategy())
    assert built.layers[-1].dtype_policy.name == "mixed_bfloat16"
    assert built(x[:2]).dtype == tf.float32  # the builder's output, cast

    class Sub(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.d = keras.layers.Dense(1)

        def call(self, t):
            return self.d(t)

    sub = Sub()
    sub.compile("sgd", "mse")
    sub(x[:2])
    precision_lib.apply(sub, "mixed_bfloat16")
    assert sub.d.dtype_policy.name == "mixed_bfloat16"
    assert sub(x[:2]).dtype == tf.float32
    # A model loaded from disk shares no policy object (but its input layer's,
    # which computes nothing): nothing looks pinned, and every float32 layer
    # but the output takes the mixed policy.
    copy = _saved_and_loaded(make("noisy")[0])
    precision_lib.apply(copy, "mixed_bfloat16")
    assert [layer.dtype_policy.name for layer in copy.layers[1:]] == [
        "mixed_bfloat16",
        "mixed_bfloat16",
        "float32",
    ]


def test_model_checkpoint_in_a_mixed_run_saves_as_readme_says(tmp_path):
    """README's choice: the user's ModelCheckpoint sees the model that trains.
    A whole-model save carries the mixed policy (as under Keras's own mixed
    precision); saved weights are float32 and load into the user's model."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x, y = regression(64)
    whole = str(tmp_path / "model.keras")
    weights = str(tmp_path / "model.weights.h5")
    history = kerascale.fit(
        model,
        x,
        y,
        batch_size=16,
        epochs=2,
        precision="mixed_bfloat16",
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(whole),
            keras.callbacks.ModelCheckpoint(weights, save_weights_only=True),
        ],
    )
    assert history.plan.precision == "mixed_bfloat16"
    assert model.layers[0].dtype_policy.name == "float32"  # the user's model
    saved = keras.saving.load_model(whole)
    assert saved.layers[0].dtype_policy.name == "mixed_bfloat16"
    assert saved.layers[-1].dtype_policy.name == "float32"  # output kept float32
    fresh = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
    )
    fresh.load_weights(weights)
    for got, want in zip(fresh.weights, model.weights, strict=True):
        assert got.dtype == "float32"
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def _saved_and_loaded(model):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model.save(os.path.join(tmp, "m.keras"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras: unbuilt optimizer variables
            return keras.saving.load_model(os.path.join(tmp, "m.keras"))


# --- Keras's meanings --------------------------------------------------------------


def regression(n=512):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, x[:, :1] * 2


def small_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


class Counts(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.train = self.test = 0

    def on_train_batch_end(self, batch, logs=None):
        self.train += 1

    def on_test_batch_end(self, batch, logs=None):
        self.test += 1


def test_steps_per_epoch_and_validation_steps_keep_keras_meanings():
    x, y = regression()
    model, counts = small_model(), Counts()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    validation = ds.batch(8)  # validation_steps=3 means 3 batches of 8: 24 samples
    history = kerascale.fit(
        model,
        ds,
        batch_size=64,
        accumulation_steps=4,
        steps_per_epoch=5,
        validation_data=validation,
        validation_steps=3,
        precision="float32",
        optimize_data=False,
        epochs=1,
        verbose=0,
        callbacks=[counts],
    )
    assert history.plan.micro_batch_size == 16
    assert int(model.optimizer.iterations) == 5  # 5 updates, as Keras means it
    assert counts.train == 20  # of 4 micro-batches each
    assert counts.test == 2  # 24 samples in batches of 16


def test_save_freq_counts_updates_and_saves_at_window_ends(tmp_path):
    from kerascale.callbacks import checkpoint_store as store

    x, y = regression(256)
    backup = kerascale.callbacks.FaultTolerantBackup(
        tmp_path, save_freq=2, keep=10, verbose=0
    )
    kerascale.fit(
        small_model(),
        x,
        y,
        batch_size=64,
        accumulation_steps=4,
        precision="float32",
        epochs=1,
        verbose=0,
        callbacks=[backup],
    )
    # 4 updates of 4 micro-batches: saves after updates 2 and 4 (micro-batch
    # 8 and 16), not every 2 micro-batches; the save at the epoch's last
    # batch waits for the epoch's end, where it is the only one.
    steps = [store.verify(f)["global_step"] for f in store.scan(str(tmp_path))]
    assert sorted(steps) == [8, 16]


def test_time_budget_stops_where_an_update_ends():
    x, y = regression(512)
    now = [0.0]

    class Tick(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            now[0] += 1.0

    budget = kerascale.callbacks.TimeBudget(10.5, reserve=0.0, clock=lambda: now[0])
    model = small_model()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        kerascale.fit(
            model,
            x,
            y,
            batch_size=64,
            accumulation_steps=4,
            precision="float32",
            epochs=5,
            verbose=0,
            callbacks=[Tick(), budget],
        )
    assert budget.stopped_early
    assert int(model.optimizer.iterations) == 2  # 8 micro-steps, 2 whole updates
    assert not any("into a window" in str(w.message) for w in said)


def test_a_batch_larger_than_the_data_trains_at_the_data_size():
    x, y = regression(16)
    model = small_model()
    with pytest.warns(kerascale.KerascaleWarning, match="larger than your data"):
        history = kerascale.fit(
            model, x, y, batch_size=10**12, memory_limit="2GiB", epochs=2, verbose=0
        )
    p = history.plan
    assert (p.micro_batch_size, p.replicas, p.accumulation_steps) == (16, 1, 1)
    assert int(model.optimizer.iterations) == 2


def test_a_run_that_makes_no_update_is_an_error():
    x, y = regression(32)

    def gen():
        yield from zip(x, y, strict=True)

    spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))
    ds = tf.data.Dataset.from_generator(gen, output_signature=spec)  # length unknown
    with pytest.raises(kerascale.ConfigurationError, match="no optimizer update"):
        kerascale.fit(
            small_model(),
            ds,
            batch_size=128,
            accumulation_steps=8,  # micro-batches of 16: only 2 of 8 per window
            precision="float32",
            verbose=0,
        )


# --- find_batch_size's result ------------------------------------------------------


def test_find_batch_size_says_what_it_measured_under():
    x, y = regression(256)
    r = kerascale.find_batch_size(
        small_model(), x, y, precision="float32", memory_limit="4GiB", verbose=0
    )
    assert (r.precision, r.strategy, r.replicas) == ("float32", "default", 1)
    assert r.batch_size == r.per_replica_batch_size * r.replicas
    assert "measured under float32" in str(r)


# --- Caches ---------------------------------------------------------------------


def builder(units=4, bias=True):
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(units, use_bias=bias)]
    )
    model.compile("sgd", "mse")
    return model


def test_builders_are_keyed_by_their_code():
    fp = cache.model_fingerprint
    assert fp(functools.partial(builder, 3)) != fp(functools.partial(builder, 4))
    assert fp(lambda: builder(3)) != fp(lambda: builder(5))
    assert fp(lambda: builder(3)) == fp(lambda: builder(3))

    class Builder:
        def __init__(self, units):
            self.units = units

        def __call__(self):
            return builder(self.units)

    assert fp(Builder(2)) != fp(Builder(3)) and fp(Builder(2)) == fp(Builder(2))
    namespace: dict = {"builder": builder}
    exec("def build():\n    return builder(2)\n", namespace)
    before = fp(namespace["build"])
    exec("def build():\n    return builder(3)\n", namespace)  # edited between runs
    assert fp(namespace["build"]) != before


def test_a_model_is_keyed_by_its_layers_and_compile_not_its_rate():
    """The learning rate moves no measurement: a notebook that reruns a cell
    with another rate (or a model a `ReduceLROnPlateau` cut) reads its
    search; another optimizer, loss or layer does not."""
    fp = cache.model_fingerprint

    def model(optimizer, loss="mse", units=4):
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
        m.compile(optimizer, loss)
        return m

    adam = fp(model(keras.optimizers.Adam(1e-3)))
    assert fp(model(keras.optimizers.Adam(5e-2))) == adam
    assert fp(model(keras.optimizers.SGD(1e-3))) != adam
    assert fp(model(keras.optimizers.Adam(1e-3), loss="mae")) != adam
    assert fp(model(keras.optimizers.Adam(1e-3), units=5)) != adam
    decay = keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.5)
    other = keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9)
    scheduled = fp(model(keras.optimizers.Adam(decay)))
    assert scheduled != adam and fp(model(keras.optimizers.Adam(other))) != scheduled


def how(plan):
    """How the plan's batch was searched ("cached search" where it was read)."""
    why = plan.reasons["global_batch_size"]
    assert why.code == "batch.searched", why
    return why.details["how"]


def test_a_partial_builder_trains_and_two_lambdas_get_their_own_answers():
    x, y = regression(256)
    kerascale.fit(functools.partial(builder, 2), x, y, epochs=1, verbose=0)
    # memory_limit: a CPU's "auto" batch (Keras's 32) is checked, and cached.
    bound = {"memory_limit": "4GiB", "verbose": 0}
    first = kerascale.plan(lambda: builder(1), x, y, **bound)
    second = kerascale.plan(lambda: builder(1, bias=False), x, y, **bound)
    assert how(second) != "cached search"
    again = kerascale.plan(lambda: builder(1), x, y, **bound)
    assert how(again) == "cached search"
    assert again.global_batch_size == first.global_batch_size


def test_pipelines_are_keyed_by_their_functions_and_size():
    x, y = regression(64)
    base = tf.data.Dataset.from_tensor_slices((x, y))
    twice = data_signature.signature(base.map(lambda a, b: (a * 2.0, b)))
    assert twice == data_signature.signature(base.map(lambda a, b: (a * 2.0, b)))
    assert twice != data_signature.signature(base.map(lambda a, b: (a * 3.0, b)))
    fewer = base.take(32).map(lambda a, b: (a * 2.0, b))
    assert twice != data_signature.signature(fewer)


def test_remeasure_and_clear_cache(no_budget):
    """On a CPU an "auto" batch is Keras's 32, and memory_limit checks it: the
    check's answer is what is cached."""
    x, y = regression(256)
    model = small_model()
    bound = {"precision": "float32", "memory_limit": "4GiB", "verbose": 0}
    kerascale.plan(model, x, y, **bound)
    cached = kerascale.plan(model, x, y, **bound)
    assert how(cached) == "cached search"
    fresh = kerascale.plan(model, x, y, remeasure=True, **bound)
    assert how(fresh) != "cached search"
    assert kerascale.clear_cache() >= 1
    after = kerascale.plan(model, x, y, **bound)
    assert how(after) != "cached search"
    with pytest.raises(kerascale.ConfigurationError, match="remeasure=1"):
        kerascale.fit(model, x, y, remeasure=1)


# --- Probe children never run the user's script again --------------------------


SCRIPT = """
import os, sys
import numpy as np, keras, kerascale

with open(sys.argv[1], "a") as f:  # one line each time this script runs
    f.write("ran\\n")


class Scale(keras.layers.Layer):  # defined in the script itself (__main__)
    def call(self, x):
        return x * 2.0


inputs = keras.Input((4,))
model = keras.Model(inputs, keras.layers.Dense(1)(Scale()(inputs)))
model.compile("sgd", "mse")
x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
history = kerascale.fit(model, x, x[:, :1], epochs=1, verbose=0,
                        memory_limit="3GiB")  # unguarded, as many scripts are
print(history.plan.reasons["global_batch_size"])
"""


def test_probes_never_run_the_users_script_again(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    ran = tmp_path / "ran.txt"
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "KERASCALE_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(ran)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ran.read_text() == "ran\n"  # once: no child ran it again
    assert "searched (" in proc.stdout
