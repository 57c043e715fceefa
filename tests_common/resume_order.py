"""A resume checks its data order instead of trusting it (issue 56).

Keras 3.16 seeds its shuffle from the data adapter's epoch counter
(keras-team/keras#23046) where Keras 3.15 read NumPy's and Python's global
random state; kerascale puts back whichever this Keras reads
(`_keras_compat.epoch_order`), and then checks: a save records a digest of
the last batch it trained, and the resume compares the last batch it reads
again with it. A Keras that orders an epoch otherwise (simulated through the
seam: the order's state not put back) and data changed between the runs
both warn, naming the cause; a resume in the same order says nothing. In
process, on both backends (tests/test_resume_order.py and
tests_jax/test_resume_order.py run these) and on both Keras versions the
suite runs (the lane of keras-nightly runs them too). The real kills are
the backup tests'.

Which inputs the check reads (`CHECKED`): on JAX every input that resumes by
reading its epoch again (arrays, a `PyDataset`); on TensorFlow a `PyDataset`
(its adapter's generator, `_keras_compat.adapter_reads`). TensorFlow's
arrays and `tf.data` resume from the iterator's own checkpoint, whose order
TensorFlow restores with it."""

import warnings

import keras
import numpy as np
import pytest
from conformance import Interrupt
from conformance import _RaiseAt as StopAt
from conftest import dense_model, toy_data

from kerascale._keras_compat import adapter_reads, epoch_order
from kerascale.callbacks import FaultTolerantBackup, _backup_writer
from kerascale.callbacks import _input_position as position_lib
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import KerascaleWarning

ORDER = "data order after this resume differs"
CHECKED = ["arrays", "pydataset"] if keras.backend.backend() == "jax" else ["pydataset"]


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, workers=1):
        super().__init__(workers=workers)
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // 16

    def __getitem__(self, i):
        return self.x[i * 16 : (i + 1) * 16], self.y[i * 16 : (i + 1) * 16]


def data():
    return toy_data(n=160)


def run(kind, directory, x, y, callbacks=()):
    """3 shuffled epochs of 10 steps, saved every 3 steps, from one seed."""
    keras.utils.set_random_seed(0)
    model = dense_model()
    inputs = {
        "arrays": (x, y),
        "pydataset": (Batches(x, y),),
        # Read by Keras's enqueuer on 2 threads, put back in order.
        "pydataset_workers": (Batches(x, y, workers=2),),
    }[kind]
    kwargs = {"batch_size": 16} if kind == "arrays" else {}
    backup = FaultTolerantBackup(str(directory), save_freq=3)
    model.fit(
        *inputs,
        epochs=3,
        shuffle=True,
        verbose=0,
        callbacks=[backup, *callbacks],
        **kwargs,
    )
    return model


def saved_data_record(kind, directory):
    """The input's record ("data") in the checkpoint that an interrupted
    run (stopped after step 14) saved last."""
    x, y = data()
    with pytest.raises(Interrupt):
        run(kind, directory, x, y, [StopAt(14)])
    _backup_writer.wait_all()  # what a process exit or the rerun waits for
    latest = next(f for f in store.scan(str(directory)) if f.state == "complete")
    return store.verify(latest)["data"]


def interrupted_then_resumed(kind, tmp_path, rerun_data=None):
    """Stopped after step 14 (the last save: epoch 2, step 2), then rerun
    on `rerun_data` (default: the same). Returns (the model, the warnings)."""
    x, y = data()
    with pytest.raises(Interrupt):
        run(kind, tmp_path, x, y, [StopAt(14)])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = run(kind, tmp_path, *(rerun_data or (x, y)))
    return model, [str(w.message) for w in said if w.category is KerascaleWarning]


def same_weights(a, b):
    return all(
        np.array_equal(u, v)
        for u, v in zip(a.get_weights(), b.get_weights(), strict=True)
    )


@pytest.mark.once
@pytest.mark.parametrize("kind", ["arrays", "pydataset"])
def test_a_resume_in_the_same_order_matches_and_says_nothing(kind, tmp_path):
    straight = run(kind, tmp_path / "straight", *data())
    resumed, said = interrupted_then_resumed(kind, tmp_path / "resumed")
    assert not [s for s in said if ORDER in s], said
    assert same_weights(resumed, straight)


def carried_at_each_epoch(kind, directory):
    """The batches Keras's enqueuer held at each epoch's on_epoch_begin, and
    whether it was running there, in a plain fit of `run` (a PyDataset read
    by workers: each backend's file pins what it gives)."""
    seen = []

    class Look(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.adapter = epoch_order.adapter_of(epoch_order.fit_epoch_iterator())

        def on_epoch_begin(self, epoch, logs=None):
            running = self.adapter.enqueuer.is_running()
            seen.append((epoch_order.carried_batches(self.adapter), running))

    run(kind, directory, *data(), [Look()])
    return seen


@pytest.mark.once
@pytest.mark.parametrize("kind", CHECKED)
def test_an_order_changed_behind_the_checkpoint_is_said(kind, tmp_path, monkeypatch):
    """A Keras that orders the epoch by something the checkpoint does not
    put back: the seam leaves both the counter and the global random state
    as the rerun found them, and this Keras has another version than the one
    that wrote the checkpoint (its meta.json's), which the warning names."""
    x, y = data()
    with pytest.raises(Interrupt):
        run(kind, tmp_path, x, y, [StopAt(14)])
    written = keras.__version__
    monkeypatch.setattr(position_lib, "restore_random_state", lambda state: None)
    monkeypatch.setattr(epoch_order, "set_counter", lambda adapter, value: False)
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    with pytest.warns(KerascaleWarning, match=ORDER) as said:
        run(kind, tmp_path, x, y)
    ordered = [str(w.message) for w in said if ORDER in str(w.message)]
    assert len(ordered) == 1  # once, and training went on
    assert f"written with Keras {written} and this is Keras 3.99.0" in ordered[0]
    assert "will not match an uninterrupted run" in ordered[0]


@pytest.mark.once
@pytest.mark.parametrize("kind", CHECKED)
def test_data_changed_between_the_runs_is_said_once(kind, tmp_path):
    """The input's fingerprint says it (tests_common/input_fingerprint.py),
    and the last batch's check, which would say it too, says nothing more."""
    x, y = data()
    changed = (x[::-1].copy(), y[::-1].copy())
    _, said = interrupted_then_resumed(kind, tmp_path, rerun_data=changed)
    about = [s for s in said if ORDER in s or "The input differs" in s]
    assert len(about) == 1, said
    assert "The input differs from the one checkpoint" in about[0]


@pytest.mark.once
@pytest.mark.parametrize("kind", CHECKED)
def test_a_change_the_fingerprint_misses_is_said_by_the_last_batch(
    kind, tmp_path, monkeypatch
):
    """A change the input's fingerprint does not read (here: it reads
    nothing) is still said at a mid-epoch resume, by the last batch read
    again."""
    from kerascale.callbacks import _input_fingerprint

    monkeypatch.setattr(_input_fingerprint, "of_adapter", lambda adapter: None)
    x, y = data()
    changed = (x[::-1].copy(), y[::-1].copy())
    _, said = interrupted_then_resumed(kind, tmp_path, rerun_data=changed)
    ordered = [s for s in said if ORDER in s]
    assert len(ordered) == 1, said
    assert "the input changed between the runs" in ordered[0]


def test_keras_fit_still_names_its_epoch_iterator():
    """What `epoch_order.fit_epoch_iterator` finds: fails when Keras renames
    the local of its backend `fit`, and the counter is no longer put back."""
    assert epoch_order.keras_fit_holds_the_epoch_iterator()


def test_a_callback_finds_the_adapter_keras_fit_trains_on():
    found = []

    class Look(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            found.append(epoch_order.adapter_of(epoch_order.fit_epoch_iterator()))

    x, y = data()
    dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[Look()])
    assert found and found[0] is not None and hasattr(found[0], "get_numpy_iterator")


def test_what_orders_keras_s_shuffle_is_what_kerascale_puts_back():
    """The upstream behaviour the resume relies on, checked rather than
    trusted: where this Keras's adapter has an epoch counter (3.16), it
    alone orders the shuffle; where it has none (3.15), NumPy's global state
    does."""
    from keras.src.trainers.data_adapters import get_data_adapter

    x, y = data()

    def first_batch(counter=None, seed=None):
        adapter = get_data_adapter(x=x, y=y, batch_size=16, shuffle=True)
        if counter is not None:
            assert epoch_order.set_counter(adapter, counter)
        if seed is not None:
            np.random.seed(seed)
        return next(iter(adapter.get_numpy_iterator()))[0]

    adapter = get_data_adapter(x=x, y=y, batch_size=16, shuffle=True)
    if epoch_order.counter(adapter) is not None:
        assert np.array_equal(first_batch(3, seed=1), first_batch(3, seed=2))
        assert not np.array_equal(first_batch(3), first_batch(4))
    else:
        assert np.array_equal(first_batch(seed=1), first_batch(seed=1))
        assert not np.array_equal(first_batch(seed=1), first_batch(seed=2))


def test_keras_reads_a_pydataset_through_the_generators_kerascale_follows():
    """What `adapter_reads` wraps: fails when Keras renames the adapter's
    generators or reads a PyDataset around them, and the order check on
    TensorFlow would see no batch."""
    from keras.src.trainers.data_adapters import get_data_adapter

    x, y = data()
    adapter = get_data_adapter(x=Batches(x, y), shuffle=False)
    starts, reads = [], []
    undo = adapter_reads.follow(adapter, lambda: starts.append(1), reads.append)
    assert undo is not None
    given = list(adapter.get_numpy_iterator())
    assert len(starts) == 1 and len(reads) == len(given) == 10
    assert np.array_equal(reads[3][0], given[3][0])
    undo()
    assert not any(name in vars(adapter) for name in adapter_reads.GENERATORS)


def test_a_batch_the_digest_cannot_read_trains_on_with_no_digest():
    """`Digests.add` runs where Keras reads each batch: a batch it cannot
    digest must not stop training that plain `fit` would do."""
    from kerascale.callbacks._input_order import Digests

    class Unsliceable:
        shape = (2, 3)
        dtype = "float32"

    digests = Digests()
    digests.add((Unsliceable(),))
    digests.add((np.ones((2, 3), "float32"),))
    assert digests.digest(1) is None
    assert digests.digest(2) is not None and len(digests.digest(2)) == 32
