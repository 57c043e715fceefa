import numpy as np
import pytest
import tensorflow as tf

import kerascale
from kerascale.apply import data as apply_data
from kerascale.plan.plan import Plan
from kerascale.sense import data_facts
from kerascale.sense.data_facts import DataFacts


def plan_with(batch, replicas=1):
    return Plan(
        "default",
        ("/cpu:0",) * replicas,
        replicas,
        "float32",
        batch // replicas,
        1,
        batch,
    )


def slices(n=10):
    return tf.data.Dataset.from_tensor_slices(
        (np.arange(n, dtype="float32")[:, None], np.arange(n))
    )


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: slices(), None),
        (lambda: slices().batch(4), 4),
        (lambda: slices().batch(4, drop_remainder=True), 4),
        (lambda: slices().batch(4).map(lambda x, y: (x * 2, y)).prefetch(2), 4),
        (lambda: slices().padded_batch(3), 3),
        (lambda: slices().batch(4).unbatch(), None),
        (lambda: slices().batch(4).unbatch().batch(5), 5),
        (lambda: slices().shuffle(10).batch(6).repeat(2), 6),
        # zip hides the chain: the first element's leading dimension tells.
        (lambda: tf.data.Dataset.zip(slices().batch(4), slices().batch(4)), 4),
    ],
)
def test_dataset_batch_size_detection(make, expected):
    assert data_facts.dataset_batch_size(make()) == expected


def test_unbatched_dataset_is_batched_to_the_plan():
    ds = apply_data.prepare(
        slices(10), DataFacts("dataset"), plan_with(4), optimize=False
    )
    assert [int(x.shape[0]) for x, _ in ds] == [4, 4, 2]


def test_batched_dataset_is_rebatched_keeping_every_sample_in_order():
    src = slices(12).batch(3)
    ds = apply_data.prepare(
        src, DataFacts("dataset", True, 3), plan_with(6), optimize=False
    )
    batches = [y.numpy().tolist() for _, y in ds]
    assert batches == [list(range(6)), list(range(6, 12))]


def test_same_batch_is_left_alone_and_optimisation_is_applied():
    src = slices(8).batch(4)
    untouched = apply_data.prepare(
        src, DataFacts("dataset", True, 4), plan_with(4), optimize=False
    )
    assert untouched is src
    ds = apply_data.prepare(
        src, DataFacts("dataset", True, 4), plan_with(4), optimize=True
    )
    assert type(ds).__name__ == "_PrefetchDataset"
    assert ds.options().experimental_optimization.map_parallelization is True
    assert [y.numpy().tolist() for _, y in ds] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_inspect_errors():
    with pytest.raises(kerascale.DataError, match="empty dataset"):
        data_facts.inspect(slices(0))
    with pytest.raises(kerascale.DataError, match=r"infinite dataset.*steps_per_epoch"):
        data_facts.inspect(slices().repeat())
    assert data_facts.inspect(slices().repeat(), steps_per_epoch=5).kind == "dataset"
    with pytest.raises(
        kerascale.DataError,
        match=r"^Data cardinality is ambiguous.* 'x' sizes: 10, 'y' sizes: 9$",
    ):
        data_facts.inspect(np.zeros((10, 2)), np.zeros(9))
    with pytest.raises(
        kerascale.DataError, match=r"same number of samples\. 'x' sizes: 3, 4"
    ):
        data_facts.inspect({"a": np.zeros((3, 1)), "b": np.zeros((4, 1))}, np.zeros(3))
    with pytest.raises(kerascale.DataError, match="0 samples"):
        data_facts.inspect(np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(kerascale.DataError, match="y must be None"):
        data_facts.inspect(slices(), np.zeros(3))
    with pytest.raises(kerascale.DataError, match="x is required"):
        data_facts.inspect(None)
    # A generator is Keras's to read: kerascale never reads it ahead.
    facts = data_facts.inspect(x for x in range(3))
    assert facts.kind == "other" and "generator" in facts.why_not_measurable


def test_arrays_facts():
    facts = data_facts.inspect(
        {"a": np.zeros((7, 2)), "b": np.zeros((7,))}, np.zeros(7)
    )
    assert facts == DataFacts(kind="arrays", num_samples=7)


def test_validation_data():
    plan = plan_with(4)
    ds, own = apply_data.prepare_validation(slices(10), plan, optimize=False)
    assert [int(x.shape[0]) for x, _ in ds] == [4, 4, 2]
    assert own == 4  # unbatched: validation_steps counts batches of batch_size
    batched, own = apply_data.prepare_validation(
        slices(10).batch(2), plan, optimize=False
    )
    assert own == 2 and [int(x.shape[0]) for x, _ in batched] == [4, 4, 2]
    arrays = (np.zeros((5, 1)), np.zeros(5))
    assert apply_data.prepare_validation(arrays, plan, optimize=False) == (arrays, 4)
    with pytest.raises(
        kerascale.DataError,
        match=r"'validation_data' sizes: 5, 'y' sizes: 4",
    ):
        apply_data.prepare_validation(
            (np.zeros((5, 1)), np.zeros(4)), plan, optimize=False
        )
    # What kerascale cannot read goes to Keras as it is (Keras raises for
    # what it cannot read either: its error, not ours).
    assert apply_data.prepare_validation("val.csv", plan, optimize=False) == (
        "val.csv",
        None,
    )
    with pytest.raises(kerascale.DataError, match="empty dataset"):
        apply_data.prepare_validation(slices(0), plan, optimize=False)


def test_reads_files(tmp_path):
    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(b"x")
    assert data_facts.reads_files(
        tf.data.TFRecordDataset([path]).map(lambda r: r).batch(2)
    )
    files = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"))
    assert data_facts.reads_files(files.interleave(tf.data.TFRecordDataset).batch(2))
    assert not data_facts.reads_files(slices().batch(2))
    assert data_facts.inspect(tf.data.TFRecordDataset([path])).from_files


def test_shard_policy_set_for_several_replicas():
    policy = tf.data.experimental.AutoShardPolicy
    facts = DataFacts("dataset", True, 4)
    ds = apply_data.prepare(
        slices(8).batch(4), facts, plan_with(4, replicas=2), optimize=True
    )
    assert ds.options().experimental_distribute.auto_shard_policy == policy.DATA
    ds = apply_data.prepare(slices(8).batch(4), facts, plan_with(4), optimize=True)
    assert ds.options().experimental_distribute.auto_shard_policy == policy.AUTO
    # Files: TensorFlow's AUTO (by file, by data when files are fewer than
    # workers; FILE alone fails there).
    files = DataFacts("dataset", True, 4, from_files=True)
    ds = apply_data.prepare(
        slices(8).batch(4), files, plan_with(4, replicas=2), optimize=True
    )
    assert ds.options().experimental_distribute.auto_shard_policy == policy.AUTO


def _double(a, b):
    return a * 2.0, b + 1


def _as_dict(a, b):
    return {"f": a}, tf.cast(b, tf.float32)


def test_parallel_maps_run_the_same_functions_in_parallel():
    x = np.arange(40, dtype="float32").reshape(20, 2)
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(20))).map(_double)
    ds = ds.map(_as_dict)
    fast = apply_data.parallel_maps(ds)
    assert type(fast).__name__ == "_ParallelMapDataset"
    assert type(fast._input_dataset).__name__ == "_ParallelMapDataset"
    assert fast.element_spec == ds.element_spec
    for (a, a_y), (b, b_y) in zip(ds, fast, strict=True):  # order kept
        np.testing.assert_array_equal(a["f"], b["f"])
        assert float(a_y) == float(b_y)


def test_parallel_maps_take_stateful_random_augmentation():
    """TensorFlow's map_parallelization skips stateful functions; these are
    the augmentations that cost the most."""
    images = np.zeros((16, 8, 8, 3), "uint8")

    def augment(image):
        image = tf.cast(image, tf.float32)
        return tf.image.random_brightness(tf.image.random_flip_left_right(image), 0.2)

    ds = tf.data.Dataset.from_tensor_slices(images).map(augment)
    fast = apply_data.parallel_maps(ds)
    assert type(fast).__name__ == "_ParallelMapDataset"
    assert len(list(fast)) == 16 and fast.element_spec == ds.element_spec


def test_parallel_maps_leave_other_pipelines_alone():
    ds = tf.data.Dataset.range(8).map(lambda v: v * 3).batch(4)  # batch on top
    assert apply_data.parallel_maps(ds) is ds
    plain = tf.data.Dataset.range(8)
    assert apply_data.parallel_maps(plain) is plain


def test_the_stateful_check_runs_once_per_dataset(monkeypatch):
    """It serialises the pipeline (tens of ms): each dataset is checked once."""
    calls = []
    real = data_facts._stateful_reason
    monkeypatch.setattr(
        data_facts, "_stateful_reason", lambda ds: calls.append(ds) or real(ds)
    )
    ds = tf.data.Dataset.range(4).map(
        lambda v: tf.cast(v, tf.float32) + tf.random.uniform(())
    )
    first = data_facts.stateful_reason(ds)
    assert first and "stateful operations" in first
    assert data_facts.stateful_reason(ds) == first and len(calls) == 1
    assert data_facts.stateful_reason(ds.batch(2)) and len(calls) == 2
    assert data_facts.stateful_reason(tf.data.Dataset.range(3)) is None


def test_map_parallelization_is_named_only_where_a_map_runs_one_at_a_time():
    """The plan names "map parallelization" where a `map` has no
    `num_parallel_calls`; not for a map already parallel, nor where there is
    no map (it was listed for every dataset)."""
    base = tf.data.Dataset.range(64).map(lambda i: tf.cast(i, tf.float32))
    x = tf.data.Dataset.range(64)
    for ds, named in (
        (base, True),
        (x.map(lambda i: i * 2, num_parallel_calls=tf.data.AUTOTUNE), False),
        (x.map(lambda i: i * 2, num_parallel_calls=2), False),
        (x, False),
    ):
        facts = data_facts.inspect(ds.batch(8))
        assert facts.sequential_map is named
        # Below a batch, tf.data's option parallelizes the map: named so.
        report = apply_data.optimize_report(ds.batch(8))
        assert ("map parallelization" in report) is named, report
        # At the top, optimize runs it in parallel itself, and says that.
        report = apply_data.optimize_report(ds)
        assert "map parallelization" not in report, report
        assert ("parallel maps" in report) is named, report
