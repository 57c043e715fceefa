"""`kerascale.data.materialize`: the deterministic part of a pipeline
written once as shards and read back in parallel, the random part applied
after; verified before it is reused, and never trusted after a kill while
writing. Real JPEG files, real processes."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from materialize_child import N, pipeline, then

import kerascale
from kerascale.data import materialized

# One worker runs this module: its module-scoped fixtures or its cache
# of reference runs are made once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("tests/test_materialize")

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for i in range(24):
        pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
        tf.io.write_file(str(folder / f"{i:03d}.jpg"), tf.io.encode_jpeg(pixels))
    return folder


def decode(path):
    pixels = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    label = tf.strings.to_number(tf.strings.substr(path, -7, 3), tf.int32)
    return tf.image.resize(pixels, (32, 32)), label


def augment(x, y):
    return tf.image.random_flip_left_right(x), y


def decoded(images):
    files = tf.data.Dataset.list_files(str(images / "*.jpg"), shuffle=False)
    return files.map(decode, num_parallel_calls=2)


def labels(ds):
    return [int(v) for _, y in ds.as_numpy_iterator() for v in np.atleast_1d(y)]


def test_the_deterministic_part_is_written_once_and_the_random_part_applied_after(
    images, tmp_path
):
    tf.random.set_seed(3)
    ds = decoded(images).shuffle(24, seed=1).map(augment).batch(5).prefetch(2)
    done = materialized(ds, tmp_path / "shards")
    assert not done.reused
    assert done.deterministic == ("TensorSlice", "ParallelMap")
    assert done.then == ("Shuffle", "Map", "Batch", "Prefetch")
    assert done.elements == 24
    assert done.bytes > 24 * 32 * 32 * 3 * 4  # float32 pixels, decoded
    assert done.dataset.element_spec == ds.element_spec
    # The shuffle is applied again with its seeds: the labels of each epoch
    # come in the order the original pipeline gives them.
    tf.random.set_seed(3)
    reference = decoded(images).shuffle(24, seed=1).map(augment).batch(5)
    epochs = [labels(done.dataset) for _ in range(2)]
    assert epochs == [labels(reference) for _ in range(2)]
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == list(range(24))
    # The pixels are the decoded ones (up to the random flip).
    original = {int(y): x for x, y in decoded(images).as_numpy_iterator()}
    for xs, ys in done.dataset.as_numpy_iterator():
        for x, y in zip(xs, ys, strict=True):
            assert np.allclose(x, original[int(y)]) or np.allclose(
                x, original[int(y)][:, ::-1]
            )


def test_a_pipeline_without_randomness_reads_back_in_its_own_order(images, tmp_path):
    ds = decoded(images).batch(7)
    done = materialized(ds, tmp_path)
    assert done.then == ("Batch",)
    for got, want in zip(done.dataset, ds, strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_a_second_run_reuses_the_set_and_a_changed_input_is_written_again(
    images, tmp_path
):
    first = materialized(decoded(images).batch(4), tmp_path)
    again = materialized(decoded(images).batch(4), tmp_path)
    assert again.reused and again.path == first.path
    assert labels(again.dataset) == labels(first.dataset)
    # Another decode: another fingerprint, another set.
    other = decoded(images).map(lambda x, y: (x / 255.0, y)).batch(4)
    assert materialized(other, tmp_path).path != first.path
    # A file the pipeline reads changes: the set is stale and never read.
    pixels = np.zeros((40, 40, 3), np.uint8)
    tf.io.write_file(str(images / "005.jpg"), tf.io.encode_jpeg(pixels))
    changed = materialized(decoded(images).batch(4), tmp_path)
    assert not changed.reused and changed.path != first.path
    x = next(x for x, y in changed.dataset.unbatch().as_numpy_iterator() if y == 5)
    assert float(x.max()) < 10  # the new, black image


def test_a_damaged_set_is_written_again_with_a_warning(images, tmp_path, caplog):
    done = materialized(decoded(images), tmp_path)
    shard = next(
        os.path.join(folder, name)
        for folder, _, names in os.walk(done.path)
        for name in names
        if name.endswith(".snapshot")
    )
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    again = materialized(decoded(images), tmp_path)
    assert not again.reused
    assert "not the size it was written at" in caplog.text
    assert sorted(labels(again.dataset)) == list(range(24))


def test_a_kill_while_writing_leaves_no_set_a_later_run_trusts(tmp_path):
    """A real SIGKILL in the middle of writing: what it leaves is never
    read, the next run writes the set in full, and removes the leftover."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": HERE}
    child = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "materialize_child.py"), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        partial = [n for n in os.listdir(tmp_path) if n.startswith(".partial-")]
        if partial and any(
            name.endswith(".snapshot")
            for _, _, names in os.walk(tmp_path / partial[0])
            for name in names
        ):
            break
        time.sleep(0.05)
    else:
        child.kill()
        pytest.fail("the child never started writing")
    time.sleep(0.5)  # well inside its N x DELAY = 3.6 s of writing
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    left = os.listdir(tmp_path)
    assert left == partial  # only the half-written set, under its temporary name
    done = materialized(pipeline(), tmp_path, then=then)
    assert not done.reused and done.elements == N
    assert os.listdir(tmp_path) == [os.path.basename(done.path)]  # swept
    firsts = [int(x[0]) for x, _ in done.dataset.unbatch().as_numpy_iterator()]
    assert firsts == list(range(N))  # every element, in order
    # And a later process trusts the complete set.
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "materialize_child.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "reused": True,
        "elements": N,
    }


def test_where_kerascale_cannot_tell_the_split_it_asks_for_it(images, tmp_path):
    files = str(images / "*.jpg")
    with pytest.raises(kerascale.ConfigurationError, match="list_files shuffles"):
        materialized(tf.data.Dataset.list_files(files).map(decode), tmp_path)
    with pytest.raises(kerascale.ConfigurationError, match=r"then=lambda ds"):
        materialized(pipeline(), tmp_path)  # Python code: is it deterministic?
    with pytest.raises(kerascale.ConfigurationError, match="move the shuffle"):
        materialized(decoded(images).shuffle(4), tmp_path, then=lambda ds: ds)
    with pytest.raises(kerascale.ConfigurationError, match="never ends"):
        scaled = decoded(images).repeat().map(lambda x, y: (x / 2, y))
        materialized(scaled.shuffle(4), tmp_path)
    # A repeat after the deterministic part is applied again, not written.
    again = materialized(decoded(images).repeat(2).map(augment), tmp_path)
    assert again.elements == 24 and again.then == ("Repeat", "Map")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ds": np.zeros(3)}, "ds must be a tf.data.Dataset. Received: ds='ndarray'"),
        ({"directory": 3}, "directory must be a folder path. Received: directory=3"),
        ({"then": 5}, "then must be None or a function"),
    ],
)
def test_arguments_are_checked_at_the_door(images, tmp_path, kwargs, message):
    arguments = {"ds": decoded(images), "directory": tmp_path, **kwargs}
    with pytest.raises(kerascale.ConfigurationError, match=message):
        kerascale.data.materialize(**arguments)
    assert not os.listdir(tmp_path)  # nothing written


def small_model():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(24)(h))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_fit_materializes_and_trains_as_on_the_pipeline(images, tmp_path):
    folder = tmp_path / "shards"
    settings = dict(epochs=2, verbose=0, precision="float32", optimize_data=False)
    plan = kerascale.plan(
        small_model(), decoded(images).batch(8), materialize=folder, **settings
    )
    assert "(written when fit runs)" in plan.reasons["data_changes"]
    assert not folder.exists()  # planning writes nothing
    history = kerascale.fit(
        small_model(), decoded(images).batch(8), materialize=folder, **settings
    )
    plan = history.plan
    assert plan.data_changes.materialized
    assert "materialized TensorSlice -> ParallelMap to" in plan.reasons["data_changes"]
    reference = small_model().fit(decoded(images).batch(8), epochs=2, verbose=0)
    np.testing.assert_allclose(
        history.history["loss"], reference.history["loss"], rtol=1e-5
    )
    again = kerascale.plan(
        small_model(), decoded(images).batch(8), materialize=folder, **settings
    )
    assert "(reused)" in again.reasons["data_changes"]


def test_fit_trains_what_it_cannot_materialize_as_given_with_one_warning(
    images, tmp_path
):
    ds = tf.data.Dataset.list_files(str(images / "*.jpg")).map(decode).batch(8)
    with pytest.warns(kerascale.KerascaleWarning, match="list_files shuffles") as w:
        history = kerascale.fit(
            small_model(),
            ds,
            materialize=tmp_path,
            epochs=1,
            verbose=0,
            precision="float32",
        )
    assert sum("materialize=" in str(m.message) for m in w) == 1
    assert not history.plan.data_changes.materialized
    with pytest.raises(kerascale.ConfigurationError, match="materialize must be"):
        kerascale.fit(small_model(), ds, materialize=3)
