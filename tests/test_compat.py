"""kerascale's uses of private Keras names: the multi-worker fix, pinned to
the upstream code it replaces and run by two real worker processes on
127.0.0.1; and the model internals, pinned by what they do."""

import json
import os
import shutil
import subprocess
import sys
import time

import fresh_process
import keras
import numpy as np
import pytest
import tensorflow as tf
from test_multiworker import load, max_diff, run_cluster_and_single

from kerascale import _keras_compat as compat

# Also run on the next Keras (the nightly lanes).
pytestmark = pytest.mark.nightly


def test_upstream_code_is_the_code_the_fix_replaces():
    """Fails when Keras changes the patched functions: revisit
    kerascale/_keras_compat/ (and drop it if keras-team/keras#20585 is
    fixed)."""
    assert compat.upstream_changed() == []


@pytest.mark.cluster
def test_two_workers_train_like_one_process(tmp_path):
    """Plain `model.fit` under a MultiWorkerMirroredStrategy the user made,
    with only the compat fix: as a user who brings their own strategy runs."""
    run_cluster_and_single("compat", tmp_path)
    (w0, r0), (w1, r1), (ws, rs) = (
        load(tmp_path, "compat", n) for n in ("w0", "w1", "single")
    )
    assert max_diff(w0, w1) == 0.0  # the workers agree exactly
    assert max_diff(w0, ws) <= 1e-5  # and match one process
    assert r0["history"] == r1["history"]
    np.testing.assert_allclose(r0["history"]["loss"], rs["history"]["loss"], atol=1e-5)


def test_the_model_internals_kerascale_uses_still_do_what_it_relies_on():
    """Fails when Keras renames or changes them (see PRIVATE_NAMES; the JAX
    backend's, the last, are checked in tests_jax/test_compat_jax.py)."""
    assert len(compat.PRIVATE_NAMES) == 21
    x, y = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")
    # The first step's variables, loss and metrics built from a spec alone.
    fresh = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    fresh.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert not fresh._compile_loss.built and not fresh._compile_metrics.built
    spec = (tf.TensorSpec((None, 2)), tf.TensorSpec((None, 1)))
    compat.build_like_first_step(fresh, spec)
    assert fresh._compile_loss.built and fresh._compile_metrics.built
    assert fresh.optimizer.built
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert compat.compile_arguments(model)["loss"] == "mse"
    # compile makes its config anew: its identity tells a second compile.
    token = compat.compile_token(model)
    assert token is not None and compat.compile_token(model) is token
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert compat.compile_token(model) is not token
    # Every layer, nested ones and the model itself, in a fixed order.
    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    inputs = keras.Input((2,))
    outer = keras.Model(inputs, keras.layers.Dense(1)(inner(inputs)))
    kinds = [type(layer).__name__ for layer in compat.all_layers(outer)]
    assert kinds[0] == "Functional" and kinds.count("Dense") == 2
    assert "Sequential" in kinds
    # Keras's counters of automatic names are put back after models made
    # for kerascale's own measurements.
    with compat.names_kept():
        made = [keras.layers.Dense(1).name for _ in range(2)]
    assert keras.layers.Dense(1).name == made[0] != made[1]
    # Functional and its subclasses are told apart from subclassed models.
    assert compat.is_graph_model(outer) and not compat.is_graph_model(inner)

    class Task(type(outer)):  # as keras-hub's tasks subclass Functional
        pass

    assert compat.is_graph_model(Task(inputs, outer.outputs))
    assert not compat.is_graph_model(keras.layers.Dense(1))

    class Holder(keras.layers.Layer):  # holds a layer as an attribute
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(1)

    assert [type(x) for x in compat.tracked_layers(Holder())] == [keras.layers.Dense]
    # fit starts at the initial epoch while its run is alive, not after.
    compat.set_initial_epoch(model, 2, lambda: True)
    assert len(model.fit(x, y, epochs=3, verbose=0).history["loss"]) == 1
    compat.set_initial_epoch(model, 2, lambda: False)
    assert len(model.fit(x, y, epochs=3, verbose=0).history["loss"]) == 3
    compat.clear_initial_epoch(model)
    assert model._initial_epoch is None
    # Building as the first step would, without training.
    fresh = keras.Sequential([keras.layers.Dense(1)])
    fresh.compile(optimizer="adam", loss="mse")
    spec = (tf.TensorSpec((None, 2)), tf.TensorSpec((None, 1)))
    compat.build_like_first_step(fresh, spec)
    assert compat.fully_built(fresh) and fresh.optimizer.built
    assert int(fresh.optimizer.iterations) == 0
    # The global seed generator: absent until asked for, then the same one.
    from keras.src.backend.common import global_state

    global_state.set_global_attribute("global_seed_generator", None)
    assert compat.existing_global_seed_generator() is None
    made = compat.global_seed_generator()
    assert compat.existing_global_seed_generator() is made


def test_the_tensorflow_internals_kerascale_uses_still_exist():
    """kerascale/_tf_compat.py: each private use, against this TensorFlow."""
    import inspect

    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars
    from tensorflow.python.eager import context

    from kerascale import _tf_compat as tfc

    tf.constant(1)
    assert tfc.tf_started() is True
    ctx = context.context()
    for name in ("set_config_key_value", "get_config_key_value"):
        assert callable(getattr(ctx, name))
    assert "timeout_in_ms" in inspect.signature(ctx.get_config_key_value).parameters
    source = inspect.getsource(cars.CollectiveAllReduceExtended)
    assert "self._id_in_cluster =" in source and "self._num_workers =" in source
    tf.random.set_seed(1234)
    assert tfc.global_seed() == 1234
    # The eager op-seed sequence (`Context._rng`): what a random op made
    # without its own seed draws, put back by `op_seeds_kept` (issue 80).
    assert ctx._internal_operation_seed() != ctx._internal_operation_seed()

    def order():  # a pipeline the user makes after kerascale's measurement
        return [int(i) for i in tf.data.Dataset.range(16).shuffle(16)]

    tf.random.set_seed(1234)
    first = order()
    tf.random.set_seed(1234)
    order()  # a measurement's pipeline, nothing kept: the next one moves
    assert order() != first
    for kept in (tfc.op_seeds_kept, compat.random_kept):
        tf.random.set_seed(1234)
        with kept():
            order()
        assert order() == first, kept
    assert tfc.slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    from tensorflow.python.distribute import multi_worker_util

    for name in ("normalize_cluster_spec", "coordination_leader"):
        assert callable(getattr(multi_worker_util, name))
    params = inspect.signature(ctx.configure_coordination_service).parameters
    for name in ("heartbeat_timeout_in_ms", "cluster_register_timeout_in_ms"):
        assert name in params
    # A lost worker: the coordination service's task states, for the jobs its
    # config names (no service runs here). tests/test_multiworker.py's killed
    # worker is the real thing.
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as pb

    assert callable(ctx.get_task_states)
    assert isinstance(type(ctx).coordination_service, property)
    fields = pb.CoordinationServiceConfig.DESCRIPTOR.fields_by_name
    assert "coordinated_job_list" in fields
    assert tfc.lost_peer() is None
    # The key-value store without a cluster: a clear TensorFlow error, one of
    # the kinds the agreement handles.
    try:
        tfc.kv_get("kerascale/none", 0.01)
    except tfc.KV_ERRORS:
        pass
    except Exception as e:  # anything else would escape the agreement's handlers
        raise AssertionError(f"{type(e).__name__}: {e}") from e


def test_a_datasets_copy_shuffles_on_its_own():
    """_tf_compat.unshared_dataset: iterating the copy leaves the order the
    user's dataset gives its next iterators as if nothing had read it, and
    the copy starts from the same seeds; draws_seeds finds a shuffle behind
    a zip, and none in a plain pipeline."""
    import tensorflow as tf

    from kerascale import _tf_compat as tfc

    def make():
        a = tf.data.Dataset.range(20).shuffle(20, seed=3)
        return tf.data.Dataset.zip(a, tf.data.Dataset.range(20)).map(lambda u, v: u)

    reference = make()
    orders = [list(reference.as_numpy_iterator()) for _ in range(2)]
    assert orders[0] != orders[1]  # each iterator reshuffles
    user = make()
    copy = tfc.unshared_dataset(user)
    assert list(copy.as_numpy_iterator()) == orders[0]  # the same seeds
    for _ in range(3):
        list(copy)
    assert [list(user.as_numpy_iterator()) for _ in range(2)] == orders
    assert copy.element_spec == user.element_spec
    assert int(copy.cardinality()) == 20
    assert tfc.draws_seeds(user)
    assert tfc.draws_seeds(tf.data.Dataset.random(seed=1).take(3))
    plain = tf.data.Dataset.range(8).map(lambda v: v * 2).batch(2).prefetch(1)
    assert not tfc.draws_seeds(plain)


def test_the_tf_data_structure_readers_see_this_tensorflows_pipelines():
    """_tf_compat's pipeline readers, against this TensorFlow: each returns
    what the pipeline was built with (a changed private name would make them
    return "nothing known", and these asserts fail)."""
    import tensorflow as tf

    from kerascale import _tf_compat as tfc

    source = tf.data.Dataset.range(12)
    shuffled = source.shuffle(12, seed=5)
    mapped = shuffled.map(lambda v: v * 3)
    filtered = mapped.filter(lambda v: v >= 0)
    batched = filtered.batch(4)
    assert tfc.dataset_input(batched) is filtered
    assert tfc.dataset_input(mapped) is shuffled
    assert tfc.dataset_input(source) is None
    assert int(tfc.iterator_dataset(iter(source.batch(4))).cardinality()) == 3
    assert tfc.dataset_inputs(tf.data.Dataset.zip(source, mapped)) == [source, mapped]
    assert tfc.static_batch_size(batched) == 4
    assert tfc.static_batch_size(mapped) is None
    assert tfc.shuffle_seeds(shuffled) not in (None, (0, 0))
    (fn,) = tfc.dataset_functions(mapped)
    assert len(tfc.dataset_functions(filtered)) == 1
    again = tfc.reapply_map(shuffled, fn, num_parallel_calls=tf.data.AUTOTUNE)
    assert sorted(again.as_numpy_iterator()) == [3 * v for v in range(12)]
    tfc.stateful_ops(batched)  # a pure pipeline: nothing raised
    noisy = source.map(lambda v: v + tf.random.uniform([], 0, 2, tf.int64))
    try:
        tfc.stateful_ops(noisy)
    except tf.errors.OpError as e:
        assert "stateful" in str(e).lower()
    else:
        raise AssertionError("a random map was not reported as stateful")


def test_each_transformation_materialize_applies_again_gives_what_it_gave():
    """_tf_compat.replay, against this TensorFlow: every transformation it
    knows, applied again on the same input from what the node keeps, gives
    the original's elements in the original's order (the shuffle too: its
    op seed is kept); any other transformation is refused by name."""
    import pytest
    import tensorflow as tf

    from kerascale import _tf_compat as tfc

    source = tf.data.Dataset.range(10)
    steps = [
        source.map(lambda v: v * 2),
        source.map(lambda v: (v, -v), num_parallel_calls=2, deterministic=True),
        source.filter(lambda v: v % 3 > 0),
        source.shuffle(10, seed=7),
        source.shuffle(10, seed=7, reshuffle_each_iteration=False),
        source.batch(3, drop_remainder=True),
        source.batch(4, num_parallel_calls=2),
        source.prefetch(2),
        source.repeat(2),
        source.with_options(tf.data.Options()),
    ]
    for node in steps:
        again = tfc.replay(node, source)
        assert type(again).__name__ == type(node).__name__
        assert again.element_spec == node.element_spec
        got = [
            tf.nest.map_structure(lambda t: t.tolist(), e)
            for e in again.as_numpy_iterator()
        ]
        want = [
            tf.nest.map_structure(lambda t: t.tolist(), e)
            for e in node.as_numpy_iterator()
        ]
        assert got == want, type(node).__name__
    with pytest.raises(tfc.NotReplayable, match="Take"):
        tfc.replay(source.take(3), source)
    # dataset_graph: the pipeline's GraphDef, constants included.
    names = tf.data.Dataset.from_tensor_slices(["a.jpg", "b.jpg"]).map(
        tf.strings.length
    )
    ops = [node.op for node in tfc.dataset_graph(names).node]
    assert "Const" in ops and "TensorSliceDataset" in ops and "MapDataset" in ops


def test_the_optimizer_internals_accumulation_uses_still_exist():
    """keras_compat section 3, against this Keras: the accumulators made on
    a built optimizer are the ones Keras's build makes, and every method the
    keras#20582 fix calls is there."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    opt = model.optimizer
    opt.build(model.trainable_variables)
    assert compat.accumulators(opt) == []
    assert float(compat.learning_rate_object(opt)) == pytest.approx(1e-3)
    assert opt._distribution_strategy is not None
    counter = compat.iterations_variable(opt)
    counter.assign(counter * 3)  # a variable, not a value
    assert int(opt.iterations) == 0
    compat.add_accumulators(opt)
    made = compat.accumulators(opt)
    assert [tuple(v.shape) for v in made] == [(3, 2), (2,)]
    reference = keras.optimizers.Adam(1e-3, gradient_accumulation_steps=2)
    reference.build(model.trainable_variables)
    assert [tuple(v.shape) for v in compat.accumulators(reference)] == [
        tuple(v.shape) for v in made
    ]
    for name in compat.ACCUMULATION_METHODS:
        assert callable(getattr(opt, name)), name
    made[0].assign(np.ones((3, 2), "float32"))
    compat.reset_accumulators(opt)
    assert float(np.abs(made[0].numpy()).sum()) == 0.0
    # Under TensorFlow's default strategy Keras's own path is kept.
    compat.fix_distributed_accumulation(opt)
    assert "_backend_apply_gradients" not in opt.__dict__


def test_read_like_fit_builds_what_keras_fit_builds_of_arrays():
    """keras_compat section 6: Keras's data adapter for arrays; on TensorFlow
    its dataset holds a copy of them (what the batch search counts in the
    process where fit trains). Fails when Keras renames it."""
    x = np.ones((4096, 16, 16, 3), "float32")  # 12 MiB
    y = np.zeros((4096, 1), "float32")
    # Counted by TensorFlow's allocator, not the process's resident memory:
    # a pool an earlier test grew in this process holds the copy unseen.
    try:
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except ValueError as e:  # TensorFlow keeps no CPU stats on some hosts
        pytest.skip(f"TensorFlow counts no CPU allocations here: {e}")
    adapter, iterator, held = compat.read_like_fit(x, y, 32, True, "tensorflow", 3)
    grown = tf.config.experimental.get_memory_info("CPU:0")["current"] - before
    assert len(held) == 2 and tuple(held[0][0].shape) == (32, 16, 16, 3)
    assert grown > x.nbytes * 0.8, grown  # the copy Keras makes of them
    x[:] = 2.0  # a copy: the batches still read are the arrays as they were
    assert float(np.max(next(iterator)[0])) == 1.0
    del adapter, iterator, held


def test_keras_fit_under_a_strategy_reads_through_an_iterator_it_drops():
    """keras_compat section 7, against this Keras: under a tf.distribute
    strategy `fit` makes an iterator of the data to build the model, drops
    it, and trains through a second one (so a generator, read by both, loses
    what the first read ahead). Fails when Keras reads one iterator only:
    then `generator_feed` can go."""
    import tensorflow as tf

    calls = []

    def batches():
        calls.append(1)
        while True:
            yield np.ones((4, 3), "float32"), np.zeros((4, 1), "float32")

    spec = (tf.TensorSpec((None, 3)), tf.TensorSpec((None, 1)))
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
    model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
    assert len(calls) == 2, calls


def test_replay_gives_every_iterator_the_generators_batches_in_order():
    """The first two iterators both read from the first batch (the second
    in another thread), the source is read once, the buffer is trimmed to
    what an open one has yet to read, and a later one starts there."""
    import threading

    from kerascale._keras_compat import generator_feed

    pulled = []

    def source():
        for i in range(200):
            pulled.append(i)
            yield i

    replay = generator_feed.Replay(source(), first=[])
    dropped = replay.reader()
    assert [next(dropped) for _ in range(5)] == [0, 1, 2, 3, 4]
    training, got = replay.reader(), []
    reader = threading.Thread(target=lambda: got.extend(training))
    reader.start()
    reader.join()
    assert got == list(range(200))
    # The dropped one, left more than _KEEP behind, goes on from the oldest
    # batch kept: the buffer never held the whole stream.
    keep = generator_feed._KEEP
    assert [next(dropped) for _ in range(3)] == [200 - keep + i for i in range(3)]
    assert pulled == list(range(200))  # the source was read once
    assert replay.held == keep - 3, replay.held
    dropped.close()
    # A later one starts where the last open one was.
    assert list(replay.reader()) == list(range(200 - keep + 3, 200))


def test_a_generator_read_at_the_door_is_replayed_until_its_first_step():
    """`first_batch`: what was read of a generator before the first step is
    yielded again by `replay`; after `settle` nothing more is kept; a
    generator superseded by a replay reads no more of the user's."""
    from kerascale.sense import first_batch

    source = iter(range(10))
    gen = first_batch.first_read(x for x in source)
    assert first_batch.first_of(gen) == 0
    assert [next(gen), next(gen), next(gen)] == [0, 1, 2]
    again = first_batch.replay(gen)
    assert next(gen, "stopped") == "stopped"  # the failed attempt's reader
    assert [next(again) for _ in range(4)] == [0, 1, 2, 3]
    first_batch.settle(again)
    assert first_batch.replay(again) is not again
    assert list(first_batch.replay(again)) == list(range(4, 10))
    assert first_batch.replay([1, 2]) == [1, 2]  # not a generator: as it is


def test_a_killed_process_s_compile_cache_is_removed_by_the_next(monkeypatch, tmp_path):
    """JAX's compile cache directory names its process and holds its owner's
    lock: one whose process is gone (killed before its exit) is removed when
    the next is made; a living process's is kept, and so is one whose process
    id is not alive here but whose owner's lock is held (a process of another
    PID namespace sharing the temporary directory)."""
    import subprocess
    import sys

    from kerascale.apply.jax import compile_cache

    monkeypatch.setattr(compile_cache.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_directory", None)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    from kerascale import _pids

    dead = gone.stdout.strip()
    orphan = tmp_path / f"kerascale-xla-{dead}-abc"
    living = tmp_path / f"kerascale-xla-{os.getppid()}-def"
    foreign = tmp_path / f"kerascale-xla-{dead}-ghi"
    older = tmp_path / f"kerascale-xla-{dead}-jkl"  # an older kerascale's
    being_made = tmp_path / f"kerascale-xla-{dead}-mno"
    for d in (orphan, living, foreign, older, being_made):
        d.mkdir()
        (d / "entry-cache").write_bytes(b"x")
    (orphan / ".owner").write_text("")  # its owner's lock, released
    _pids.hold(str(foreign))  # held, as a living process elsewhere holds it
    os.utime(older, (time.time() - 120, time.time() - 120))
    mine = compile_cache._process_directory()
    assert os.path.basename(mine).startswith(f"kerascale-xla-{os.getpid()}-")
    assert _pids.owner_alive(mine) is True
    assert not orphan.exists() and not older.exists()
    assert living.exists() and foreign.exists() and being_made.exists()
    shutil.rmtree(mine)


_NO_TF_CHILD = """
import json, sys
import keras, numpy as np
import kerascale
from kerascale._keras_compat import serialization
from kerascale.sense import model_facts
from keras.src.utils import module_utils
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                          keras.layers.Dense(2, activation="softmax")])
model.compile("sgd", "sparse_categorical_crossentropy")
with serialization.tensorflow_left_unimported():
    inside = module_utils.tensorflow._available
facts = model_facts.recreation_problem(model), model_facts.architecture(model)
x, y = np.zeros((64, 4), "float32"), np.zeros(64, "int32")
kerascale.fit(model, x, y, epochs=1, batch_size=16, verbose=0)
# What a measurement's copy does (the trials' models, a search's clone).
from kerascale.apply import model as model_lib
copy = model_lib.recreate(model, "float32", None)
print(json.dumps({"inside": inside, "after": module_utils.tensorflow._available,
                  "recreates": facts[0] == "" and copy is not model,
                  "architecture": bool(facts[1]),
                  "tensorflow": "tensorflow" in sys.modules}))
"""


def test_a_jax_fit_reads_configs_without_importing_tensorflow():
    """keras_compat section 8 (keras-team/keras#18455): on JAX with TensorFlow
    installed, Keras's serialization would import TensorFlow (2.5 s of a
    first fit, 5 s of a first search with its trials) to ask whether a value
    is one of its objects. A fit and a measurement's copy of the model leave
    it unimported. Fails when
    Keras renames the lazy module or its flag: TensorFlow is imported
    again."""
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS="")
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TF_CHILD],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {
        "inside": False,  # Keras told TensorFlow is unavailable in the block
        "after": None,  # and left to decide again after it
        "recreates": True,
        "architecture": True,
        "tensorflow": False,
    }


def test_an_iterator_state_says_whether_it_keeps_its_seed_counts():
    """_tf_compat.keeps_seeds reads the key a seed-drawing dataset's iterator
    writes its seed generator's count under (`_SEED_COUNT_KEY`), one per
    such dataset (`seed_drawers`): present while the shuffle's input has
    elements, gone once a prefetch read it to its end. If TensorFlow renames
    the key, the first assertion fails."""
    from kerascale import _tf_compat as tfc

    ds = tf.data.Dataset.range(96).shuffle(96, seed=5).batch(16)
    twice = ds.shuffle(4, seed=1)
    assert tfc.seed_drawers(ds.prefetch(8)) == 1 and tfc.seed_drawers(twice) == 2
    assert tfc.seed_drawers(tf.data.Dataset.range(3).batch(2)) == 0
    it = iter(twice)
    next(it)
    assert tfc.keeps_seeds(tfc.iterator_state(it), 2)
    ahead = iter(ds.prefetch(8))
    next(ahead)
    deadline = time.monotonic() + 10
    while tfc.keeps_seeds(tfc.iterator_state(ahead), 1):  # its thread reads on
        assert time.monotonic() < deadline, "the prefetch never reached the end"
        time.sleep(0.01)
    assert len(list(ahead)) == 5  # the epoch's batches are all still there


def test_a_snapshot_writes_the_checkpoint_the_objects_write(tmp_path):
    """_tf_compat.iterator_state and write_frozen (an asynchronous save):
    the checkpoint written from a snapshot has the keys a write of the real
    objects has (a tf.data iterator's under its legacy "ITERATOR" name), and
    reads back into real objects: the variables' values, and the iterator
    at the element after the snapshot, though the original moved on."""
    from kerascale.callbacks import _backup_state as state_lib

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("adam", "mse", metrics=["mae"])
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    model.fit(x, y, verbose=0)
    ds = tf.data.Dataset.range(40).shuffle(20, seed=1).batch(4)
    iterator = iter(ds)
    next(iterator)

    def objects(m, it):
        return {
            "model": list(m.variables),
            "optimizer": list(m.optimizer.variables),
            "metrics": list(m.metrics_variables),
            "iterator": it,
        }

    tf.train.Checkpoint(**objects(model, iterator)).write(str(tmp_path / "real"))
    snapshot = state_lib.snapshot(objects(model, iterator), "tf")
    expected = next(iterator).numpy()  # the original moves on
    model.fit(x, y, verbose=0)  # and so do the variables
    snapshot.write(str(tmp_path / "frozen"))
    real = tf.train.list_variables(str(tmp_path / "real"))
    assert "iterator/.ATTRIBUTES/ITERATOR_STATE" in [k for k, _ in real]
    assert [k for k, _ in tf.train.list_variables(str(tmp_path / "frozen"))] == [
        k for k, _ in real
    ]
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.compile("adam", "mse", metrics=["mae"])
    other.fit(x, y, verbose=0)
    fresh = iter(ds)
    status = tf.train.Checkpoint(**objects(other, fresh)).read(str(tmp_path / "frozen"))
    status.assert_existing_objects_matched()
    for saved, read in zip(snapshot.groups["model"], other.variables, strict=True):
        np.testing.assert_array_equal(saved, read.numpy())
    assert not np.array_equal(snapshot.groups["model"][0], model.variables[0].numpy())
    np.testing.assert_array_equal(next(fresh).numpy(), expected)


def test_keras_still_gives_a_short_last_call_the_end_of_a_whole_one():
    """`last_step_of_call` bounds the batch Keras gives `on_train_batch_end`
    by the epoch's steps: an epoch of 5 steps at 2 a call ends with batch 5
    (Keras 3.15), not 4. Fails when Keras reports the real end: then the
    bound is no longer needed."""
    import numpy as np

    from kerascale import _keras_compat as keras_compat

    ends = []

    class Ends(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append((batch, keras_compat.last_step_of_call(self.params, batch)))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)
    x, y = np.zeros((10, 2), "float32"), np.zeros((10, 1), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[Ends()])
    assert ends == [(1, 1), (3, 3), (5, 4)], ends
    assert int(model.optimizer.iterations) == 5


def test_tensorboards_profile_window_is_still_where_kerascale_reads_it():
    from kerascale import _keras_compat as keras_compat

    assert keras_compat.tensorboard_profiles(
        keras.callbacks.TensorBoard("/tmp/tb", profile_batch=(2, 4))
    )
    assert not keras_compat.tensorboard_profiles(keras.callbacks.TensorBoard("/tmp/tb"))


_MIRRORED_STEPS = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
import keras, numpy as np
x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=2)
try:
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    print("TRAINED")
except tf.errors.InvalidArgumentError as e:
    print("FAILED", "must feed a value for placeholder" in str(e))
"""


def test_keras_tf_fit_still_fails_at_several_steps_a_call_under_mirrored():
    """Why the plan keeps one step a call under a `tf.distribute` strategy
    of several replicas (rules._steps_per_execution): Keras's TensorFlow fit
    fails there (keras-team/keras#19246). Fails when Keras trains it: then
    the rule can go."""
    out = fresh_process.run(_MIRRORED_STEPS, timeout=300)
    assert "FAILED True" in out, out
