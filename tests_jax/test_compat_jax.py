"""The private Keras names kerascale uses on the JAX backend
(`kerascale._keras_compat`, section 4): these fail when upstream
changes them, so the workaround is revisited."""

import jax
import keras
import numpy as np
import pytest
from conftest import dense_model, devices, toy_data

from kerascale import _keras_compat as keras_compat

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly


def test_jax_variables_have_the_layout_hooks_kerascale_sets():
    v = keras.Variable(np.zeros((2, 2), "float32"))
    assert hasattr(v, "_layout") and v._layout is None
    assert callable(v._direct_assign)
    assert hasattr(v, "_value")


@pytest.mark.skipif(devices() < 2, reason="needs 2 devices")
def test_keras_still_refuses_a_model_built_before_its_distribution():
    """The upstream behaviour `lay_out` works around: when this fails, Keras
    lays out such a model itself, and the workaround can go."""
    x, y = toy_data()
    model = dense_model()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.local_devices())
    )
    with pytest.raises(ValueError, match="incompatible devices"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


@pytest.mark.skipif(devices() < 2, reason="needs 2 devices")
def test_lay_out_trains_such_a_model_and_puts_it_back():
    x, y = toy_data()
    model = dense_model(metrics=["accuracy"])
    distribution = keras.distribution.DataParallel(devices=jax.local_devices())
    keras.distribution.set_distribution(distribution)
    undo = keras_compat.lay_out(model, distribution)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    keras.distribution.set_distribution(None)
    undo()
    assert model.train_function is None  # as before the run
    for v in keras_compat.model_variables(model):
        assert v._layout is None
        assert isinstance(v.value.sharding, jax.sharding.SingleDeviceSharding)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_jax_s_coordination_store_is_where_jax_compat_reads_it():
    """kerascale/_jax_compat.py: JAX's coordination service's key-value
    store has no public API; its client is `global_state.client`
    (jax/_src/distributed.py), with the two calls an `Agreement` makes. The
    2-process SIGTERM test (test_jax_processes.py) exercises them for real,
    including the error texts ALREADY_EXISTS and DEADLINE_EXCEEDED."""
    from jax._src import distributed
    from jax._src.lib import _jax

    from kerascale import _jax_compat

    assert hasattr(distributed.global_state, "client")
    for name in ("key_value_set", "blocking_key_value_get"):
        assert callable(getattr(_jax.DistributedRuntimeClient, name))
    assert jax.errors.JaxRuntimeError in _jax_compat.KV_ERRORS
    with pytest.raises(RuntimeError, match="not joined"):
        _jax_compat.kv_get("anything", 0.1)  # alone: no client


@pytest.mark.skipif(devices() < 2, reason="needs 2 devices")
def test_lay_out_splits_an_optimizer_slot_built_before_as_its_variable():
    """keras-team/keras#21264: a slot copies its variable's layout only when
    created; `lay_out` finds a built slot's variable by the name Keras gives
    it. Fails when Keras names slots otherwise (the slot stays whole)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(16, name="wide")(inputs))
    model.compile("adam", "mse")
    model.optimizer.build(model.trainable_variables)  # slots before the layout
    mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"), jax.devices()[:2])
    layouts = keras.distribution.LayoutMap(mesh)
    layouts["wide/kernel"] = (None, "model")
    distribution = keras.distribution.ModelParallel(layout_map=layouts)
    slots = [v for v in model.optimizer.variables if v.name.startswith("wide_kernel_")]
    assert len(slots) == 2  # Adam's momentum and velocity
    undo = keras_compat.lay_out(model, distribution)
    try:
        for v in [model.get_layer("wide").kernel, *slots]:
            assert not v.value.sharding.is_fully_replicated, v.name
            assert v.value.addressable_shards[0].data.shape == (8, 8)
    finally:
        undo()
    assert all(v.value.sharding.is_fully_replicated for v in slots)


def test_set_remat_sets_what_a_remat_scope_around_construction_sets():
    """keras_compat section 5: `Operation._remat_mode`, read at each call."""
    import keras

    from kerascale import _keras_compat as keras_compat

    with keras.RematScope(mode="activations"):
        scoped = keras.layers.Dense(4, activation="gelu")
    plain = keras.layers.Dense(4, activation="gelu")
    assert keras_compat.remat_mode(plain) is None
    undo = keras_compat.set_remat([plain], "activations")
    assert keras_compat.remat_mode(plain) == keras_compat.remat_mode(scoped)
    undo()
    assert keras_compat.remat_mode(plain) is None


def test_a_fit_that_raises_leaves_empty_variables_and_the_guard_refills_them():
    """keras_compat section 6: Keras's JAX fit empties the variables at an
    epoch's first step and leaves them empty when that step raises. Fails
    when Keras stops doing so (then StateGuard can go)."""
    import numpy as np

    from kerascale import _keras_compat as keras_compat

    class Breaks(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)
            self.broken = False

        def call(self, x):
            return self.dense(x)

        def train_step(self, state, data):
            if self.broken:
                raise TypeError("a train_step of its own that fails")
            return super().train_step(state, data)

    keras.utils.set_random_seed(0)
    model = Breaks()
    model.compile("sgd", "mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    model.fit(x, y, epochs=1, verbose=0)  # built, optimizer too
    before = [np.asarray(w) for w in model.get_weights()]
    guard = keras_compat.StateGuard(model)

    class Guarded(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            guard.before_first_step()

    model.broken, model.train_function = True, None
    with pytest.raises(TypeError, match="of its own"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[Guarded()])
    assert guard.emptied()  # what Keras leaves
    assert guard.recover() and not guard.emptied()
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)  # nothing was trained


def test_read_like_fit_reads_the_batches_kerascale_counts():
    """keras_compat section 6: Keras's data adapter for arrays, read as
    fit reads it on JAX."""
    import numpy as np

    from kerascale import _keras_compat as keras_compat

    x, y = np.zeros((40, 3), "float32"), np.zeros((40, 1), "float32")
    _, _, held = keras_compat.read_like_fit(x, y, 8, True, "jax", 3)
    assert len(held) == 2 and held[0][0].shape == (8, 3)  # the step's and the next


def test_jax_cannot_join_processes_once_its_backends_started():
    """kerascale/_jax_compat.py `backends_started`: asked before joining, where
    `jax.distributed.initialize` says it only in its error's text. Fails when
    JAX renames it, or starts joining after computing (then the refusal and
    kerascale's warning can go)."""
    import subprocess
    import sys
    import warnings

    from kerascale import _jax_compat
    from kerascale.apply.jax import cluster
    from kerascale.errors import ClusterConfigError

    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import jax\nfrom kerascale import _jax_compat\n"
            "print(_jax_compat.backends_started())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fresh.stdout.strip() == "False", fresh.stderr[-2000:]
    jax.devices()
    assert _jax_compat.backends_started()
    with pytest.raises(RuntimeError):
        jax.distributed.initialize("127.0.0.1:1", 2, 0, initialization_timeout=1)
    env = {
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "0",
    }
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert cluster.join_at_import(env) is False
    assert any("JAX had already computed" in str(w.message) for w in said)
    with pytest.raises(ClusterConfigError, match="already computed"):
        cluster.connect(environ=env)
    assert not jax.distributed.is_initialized()


def test_a_user_s_own_distribution_is_known_by_its_class():
    """Keras 3.16 removed `distribute_dataset` from the Distribution base
    class (keras-team/keras#23046), which the check duck-typed on: a user's
    subclass of the base is a distribution, an object with its methods is
    not."""
    from kerascale.plan.strategy import jax as jax_rules

    base = jax_rules.distribution_base()
    assert base.__name__ == "Distribution"
    assert issubclass(keras.distribution.ModelParallel, base)

    class Mine(base):
        def get_data_layout(self, data_shape):
            return None

        def get_variable_layout(self, variable):
            return None

        def get_tensor_layout(self, path):
            return None

    mesh = keras.distribution.DeviceMesh((1,), ["batch"], jax.local_devices()[:1])
    assert jax_rules.is_distribution(Mine(mesh))
    jax_rules.validate_request(Mine(mesh))  # accepted at the door

    class Lookalike:
        def get_data_layout(self, data_shape): ...
        def get_variable_layout(self, variable): ...
        def distribute_dataset(self, dataset): ...

    assert not jax_rules.is_distribution(Lookalike())


@pytest.mark.skipif(devices() < 2, reason="needs 2 devices")
def test_device_put_without_alias_of_a_replicated_array_still_aliases():
    """The upstream behaviour `_backup_state._copy_in_flight` works around
    (jax 0.10.2; no upstream issue found, jax-ml/jax#38086 is the nearest, on
    NumPy inputs): `device_put(x, d, may_alias=False)` of an array replicated
    over several devices, d among them, returns d's buffer of x, not a copy.
    When this fails, the copy is one and the shard detour can go."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.local_devices()[:2]), ("d",))
    x = jax.device_put(np.ones((8, 4), "float32"), NamedSharding(mesh, P()))
    y = jax.device_put(x, jax.local_devices()[0], may_alias=False)
    x.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(y)


def test_super_batch_says_what_kerass_jax_iterator_reads_a_call():
    """`keras_compat.super_batch` tells whether Keras stacks a call's
    batches into one read of its JAX iterator (keras-nightly 3.16) or reads
    one a step (Keras 3.15), and `steps_in_read` counts the steps a read
    holds: over an epoch of 5 steps at 2 a call, they add up to 5 either
    way. Fails where Keras changes how it reads and the detection misses it."""
    import numpy as np

    from kerascale import _keras_compat as keras_compat

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)
    model.make_train_function()
    real, seen = model.train_function, []

    class Spy:
        def __init__(self, iterator):
            self.iterator = iterator

        def __iter__(self):
            return self

        def __next__(self):
            item = next(self.iterator)
            seen.append(item)
            return item

    model.train_function = lambda state, iterator: real(state, Spy(iterator))
    x, y = np.zeros((10, 2), "float32"), np.zeros((10, 1), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    stacked = keras_compat.super_batch(model)
    steps = [keras_compat.steps_in_read(item, stacked) for item in seen]
    assert sum(steps) == 5, steps
    assert len(seen) == (3 if stacked else 5), (stacked, steps)
