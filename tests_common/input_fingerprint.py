"""A resume checks its input at every resume point (issue 80).

Each input kind is interrupted (a raise after step 14, standing for a kill:
the real kills are the backup tests') at three resume points, then rerun
unchanged, on the same samples in another order, and on changed values:

- mid_epoch: saves every 3 steps; the newest checkpoint is epoch 2, step 2.
- epoch_end: saves at epochs' ends; the newest is epoch 1's end.
- lost_in_flight: saves every 5 steps, stopped after step 17; the newest
  (step 15) is taken away, as a save still being written at a kill never
  becomes a checkpoint, so the resume starts at epoch 1's end.

An unchanged rerun is exact and says nothing; a reordered or changed one
warns once, naming the cause (`kerascale.callbacks._input_fingerprint`).
Where an input cannot be read again without a trace (a generator; a tf.data
pipeline that reshuffles) the resume says once that it could not check.
tests/test_input_fingerprint.py (TensorFlow, and JAX beside TensorFlow in a
child) and tests_jax/test_input_fingerprint.py (JAX, without TensorFlow)
run these.
"""

import shutil
import warnings

import keras
import numpy as np
import pytest
from conformance import Interrupt
from conformance import _RaiseAt as StopAt
from conftest import dense_model, toy_data
from resume_order import Batches  # batches of 16

import kerascale
from kerascale.callbacks import FaultTolerantBackup, _backup_writer
from kerascale.callbacks import checkpoint_store as store
from kerascale.errors import KerascaleWarning

DIFFERS = "The input differs from the one checkpoint"
UNCHECKED = "could not check that the input"
ORDER = "data order after this resume differs"
BATCH, N, EPOCHS = 16, 160, 3  # 10 steps an epoch
SAVES = {"mid_epoch": 3, "epoch_end": "epoch", "lost_in_flight": 5}
STOPS = {"mid_epoch": 14, "epoch_end": 14, "lost_in_flight": 17}


def _generator(x, y):
    while True:  # steps_per_epoch counts its epochs
        for i in range(len(x) // BATCH):
            part = slice(i * BATCH, (i + 1) * BATCH)
            yield x[part], y[part]


def kinds():
    """The input kinds this backend reads."""
    out = ["arrays", "arrays_shuffled", "pydataset", "generator"]
    try:
        import grain  # noqa: F401

        out.append("grain")
    except ImportError:
        pass
    try:  # TensorFlow's backend, or JAX beside TensorFlow
        import tensorflow  # noqa: F401

        out += ["tf.data", "tf.data_shuffled"]
    except ImportError:
        pass
    return out


# Where the content cannot be read again without a trace: the resume says so,
# but where the step's batches pass through Python (JAX) and the resume is
# mid-epoch, where it reads the last batch trained again and compares it.
UNCHECKABLE = {"generator", "tf.data_shuffled"}


def unchecked(kind, point):
    """Whether the resume says it could not check `kind` at `point`."""
    if kind not in UNCHECKABLE:
        return False
    return not (point == "mid_epoch" and keras.backend.backend() == "jax")


def fit_arguments(kind, x, y):
    """(args, kwargs) of `fit` for `kind` over the arrays `x`, `y`."""
    if kind.startswith("arrays"):
        return (x, y), {"batch_size": BATCH, "shuffle": kind == "arrays_shuffled"}
    if kind == "pydataset":
        return (Batches(x, y),), {"shuffle": False}
    if kind == "generator":
        return (_generator(x, y),), {"steps_per_epoch": N // BATCH}
    if kind == "grain":
        import grain

        source = grain.MapDataset.source([(x[i], y[i]) for i in range(len(x))])
        return (source.batch(BATCH),), {}
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if kind == "tf.data_shuffled":
        ds = ds.shuffle(N, seed=1)
    return (ds.batch(BATCH),), {}


def run(kind, directory, x, y, *, save_freq, callbacks=()):
    """3 epochs of 10 steps from one seed, backed up in `directory`."""
    keras.utils.set_random_seed(0)
    model = dense_model()
    args, kwargs = fit_arguments(kind, x, y)
    backup = FaultTolerantBackup(str(directory), save_freq=save_freq)
    model.fit(*args, epochs=EPOCHS, verbose=0, callbacks=[backup, *callbacks], **kwargs)
    return model


def rerun_data(change):
    x, y = toy_data(n=N)
    if change == "reorder":  # the same samples, another order
        order = np.random.default_rng(7).permutation(N)
        return x[order], y[order]
    if change == "values":  # a preprocessing cell run again, otherwise
        return x * 2.0, y
    return x, y


def interrupted_then_rerun(kind, point, directory, change=None):
    """Interrupted at `point`, then rerun on `change`d data. Returns (the
    model, kerascale's warnings about the input)."""
    save_freq, stop = SAVES[point], StopAt(STOPS[point])
    with pytest.raises(Interrupt):
        run(kind, directory, *toy_data(n=N), save_freq=save_freq, callbacks=[stop])
    _backup_writer.wait_all()
    if point == "lost_in_flight":  # the save at step 15 never landed
        newest = next(f for f in store.scan(str(directory)) if f.state == "complete")
        assert store.verify(newest)["global_step"] == 15
        shutil.rmtree(newest.path)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = run(kind, directory, *rerun_data(change), save_freq=save_freq)
    words = [str(w.message) for w in said if w.category is KerascaleWarning]
    return model, [w for w in words if DIFFERS in w or UNCHECKED in w or ORDER in w]


def same_weights(a, b):
    return all(
        np.array_equal(u, v)
        for u, v in zip(a.get_weights(), b.get_weights(), strict=True)
    )


POINTS = list(SAVES)


# Inside a plain model.fit on JAX, FaultTolerantBackup resumes a reshuffling
# tf.data pipeline as a fresh input: the iterators the interrupted run made
# (each drew new shuffle seeds) are not made again first, as they are where
# kerascale.fit hands it its input (`_input_source`). The resume says that
# it could not check the input.
REPLAYED_BY_FIT_ONLY = pytest.mark.xfail(
    keras.backend.backend() == "jax",
    reason="a plain model.fit on JAX resumes a reshuffling tf.data as fresh",
    strict=True,
)


def _cells():
    for kind in kinds():
        for point in POINTS:
            marks = [REPLAYED_BY_FIT_ONLY] if kind == "tf.data_shuffled" else []
            yield pytest.param(kind, point, marks=marks, id=f"{kind}-{point}")


@pytest.mark.once
@pytest.mark.parametrize("kind, point", list(_cells()))
def test_an_unchanged_rerun_resumes_exactly(kind, point, tmp_path):
    straight = run(kind, tmp_path / "straight", *toy_data(n=N), save_freq="epoch")
    resumed, said = interrupted_then_rerun(kind, point, tmp_path / "resumed")
    assert same_weights(resumed, straight)
    if unchecked(kind, point):
        assert len(said) == 1 and UNCHECKED in said[0], said
    else:
        assert said == []


@pytest.mark.once
@pytest.mark.parametrize("change", ["reorder", "values"])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", kinds())
def test_a_reordered_or_changed_rerun_warns_once(kind, point, change, tmp_path):
    _, said = interrupted_then_rerun(kind, point, tmp_path, change)
    assert len(said) == 1, said
    if unchecked(kind, point):
        assert UNCHECKED in said[0]
    elif kind in UNCHECKABLE:  # the last batch, read again, differs
        assert ORDER in said[0]
    else:
        assert DIFFERS in said[0] and "will not match" in said[0]


@pytest.mark.once
def test_kerascale_fit_checks_its_input_at_an_epoch_end_resume(tmp_path):
    """Through `kerascale.fit`'s checkpoint_dir: a rerun on the samples in
    another order, resumed at an epoch's end, warns once."""
    x, y = toy_data(n=N)

    def fit(x, y, callbacks=()):
        keras.utils.set_random_seed(0)
        return kerascale.fit(
            dense_model(),
            x,
            y,
            batch_size=BATCH,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
            checkpoint_dir=str(tmp_path),
            checkpoint_freq="epoch",
            callbacks=list(callbacks),
        )

    with pytest.raises(Interrupt):
        fit(x, y, [StopAt(14)])
    _backup_writer.wait_all()
    with pytest.warns(KerascaleWarning, match=DIFFERS) as said:
        fit(*rerun_data("reorder"))
    differs = [str(w.message) for w in said if DIFFERS in str(w.message)]
    assert len(differs) == 1
    assert "rows at 8 fixed positions differ" in differs[0]


@pytest.mark.nightly
@pytest.mark.parametrize("kind", kinds())
def test_keras_adapters_keep_their_input_where_the_fingerprint_reads_it(kind):
    """What `epoch_order.input_of` reads (`INPUTS`, private attributes of
    Keras's data adapters): fails when this Keras keeps an input elsewhere,
    and the resume would no longer check it."""
    from kerascale._keras_compat import epoch_order

    found = []

    class Look(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            adapter = epoch_order.adapter_of(epoch_order.fit_epoch_iterator())
            found.append(epoch_order.input_of(adapter))

    x, y = toy_data(n=N)
    args, kwargs = fit_arguments(kind, x, y)
    kwargs.setdefault("steps_per_epoch", 2)
    dense_model().fit(*args, epochs=1, verbose=0, callbacks=[Look()], **kwargs)
    found_kind, data = found[0]
    assert found_kind == kind.removesuffix("_shuffled")
    if kind.startswith("arrays"):
        assert data[0] is x and data[1] is y
    elif kind in ("pydataset", "grain"):  # read by index: the user's own
        assert data is args[0]
