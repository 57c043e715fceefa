"""Each batch split evenly over the devices (and processes): a last batch that
the devices do not divide, which Keras's JAX fit under `DataParallel` cannot
lay out, trains on what they divide, with one warning; the rest trains as
plain `fit` on one device does."""

import warnings

import keras
import numpy as np
import pytest
from conftest import dense_model, devices, toy_data

import kerascale
from kerascale.apply.jax import even_batches

two = pytest.mark.skipif(devices() < 2, reason="needs 2 devices")


def test_each_process_reads_its_block_of_every_global_batch():
    # 10 samples, global batches of 4 over 2 processes of 1 device each.
    first = even_batches.Share(replicas=2, processes=2, index=0)
    second = even_batches.Share(replicas=2, processes=2, index=1)
    assert first.rows(10, 4).tolist() == [0, 1, 4, 5, 8]
    assert second.rows(10, 4).tolist() == [2, 3, 6, 7, 9]
    assert first.local_batch(4) == 2
    # a last batch of 3 over 2 devices: 1 sample left out, the rest shared
    assert first.rows(11, 4).tolist() == [0, 1, 4, 5, 8]
    assert second.rows(11, 4).tolist() == [2, 3, 6, 7, 9]
    assert first.dropped(11, 4) == 1
    # one process: a view of all it keeps
    assert even_batches.Share(replicas=2).rows(11, 4) == slice(0, 10)
    batch = (np.arange(5), {"a": np.arange(5) * 10})
    cut = second.of_batch(batch)
    assert cut[0].tolist() == [2, 3] and cut[1]["a"].tolist() == [20, 30]


def _plain(x, y, **kwargs):
    model = dense_model()
    keras.distribution.set_distribution(None)
    history = model.fit(x, y, verbose=0, shuffle=False, **kwargs)
    return history.history["loss"], model.get_weights()


def _kerascale(x, y, **kwargs):
    model = dense_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(model, x, y, verbose=0, shuffle=False, **kwargs)
    said = [
        str(w.message)
        for w in caught
        if issubclass(w.category, kerascale.KerascaleWarning)
        and "split" in str(w.message)
    ]
    return history, model.get_weights(), said


@two
def test_arrays_whose_last_batch_the_devices_do_not_divide_train_with_one_warning():
    x, y = toy_data(101)
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    model = dense_model()  # its variables laid out over both devices
    with pytest.raises(Exception, match="evenly divide"):  # Keras's own fit
        model.fit(x, y, batch_size=32, verbose=0, shuffle=False)
    keras.distribution.set_distribution(None)

    history, weights, said = _kerascale(x, y, batch_size=32, epochs=2)
    assert history.plan.replicas == 2
    assert history.plan.data_changes.left_out == 1
    assert len(said) == 1 and "leaves out the last 1 sample" in said[0], said
    # as plain fit on one device trains the 100 samples the devices divide
    losses, expected = _plain(x[:100], y[:100], batch_size=32, epochs=2)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-5)
    for a, b in zip(weights, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class Uneven(keras.utils.PyDataset):
    """Batches of 16, the last of 5."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.x) // 16)

    def __getitem__(self, i):
        return self.x[i * 16 : (i + 1) * 16], self.y[i * 16 : (i + 1) * 16]


@two
@pytest.mark.parametrize("kind", ["pydataset", "generator"])
def test_batches_read_as_they_come_are_cut_to_what_the_devices_divide(kind):
    x, y = toy_data(53)  # 3 batches of 16 and one of 5

    def data(x, y):
        if kind == "pydataset":
            return Uneven(x, y)
        return ((x[i : i + 16], y[i : i + 16]) for i in range(0, len(x), 16))

    steps = {} if kind == "pydataset" else {"steps_per_epoch": 4}
    history, weights, said = _kerascale(data(x, y), None, epochs=1, **steps)
    assert history.plan.data_changes.cut_as_read
    assert len(said) == 1 and "cut to 4" in said[0], said
    kept = np.r_[0:52]  # the last batch's 5 cut to 4
    losses, expected = _plain(data(x[kept], y[kept]), None, epochs=1, **steps)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-5)
    for a, b in zip(weights, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@two
def test_validation_split_and_validation_data_are_split_evenly_too():
    x, y = toy_data(101)
    vx, vy = toy_data(7, seed=1)
    history, _, _ = _kerascale(x, y, batch_size=32, validation_split=0.2, epochs=1)
    assert np.isfinite(history.history["val_loss"]).all()
    history, _, _ = _kerascale(x, y, batch_size=32, validation_data=(vx, vy), epochs=1)
    assert np.isfinite(history.history["val_loss"]).all()


def test_on_one_device_nothing_is_cut():
    x, y = toy_data(101)
    history, _, said = _kerascale(x, y, batch_size=32, strategy="default")
    assert not said
    assert not history.plan.data_changes.left_out


@two
def test_a_step_too_small_to_share_stays_on_one_device_without_a_warning():
    """Keras's SwapEMAWeights test: 10 samples at the default batch, whose
    validation metric must equal `evaluate`'s after fit, to the last digit.
    Split 5 and 5 over 2 devices its sum came out one ulp apart."""
    x, y = toy_data(10)
    model = dense_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(
            model, x, y, epochs=2, verbose=0, validation_data=(x, y)
        )
    assert not [w for w in caught if issubclass(w.category, kerascale.KerascaleWarning)]
    assert history.plan.replicas == 1
    assert history.plan.reasons["strategy"].code == "strategy.kept_one_device"
    assert "fewer than 8" in history.plan.reasons["strategy"]
    logs = model.evaluate(x, y, return_dict=True, verbose=0)
    assert history.history["val_loss"][-1] == logs["loss"]
    # 16 samples (8 each) are split, at a batch of 8 too (4 each)
    plan = kerascale.plan(dense_model(), *toy_data(16), batch_size=8, verbose=0)
    assert plan.replicas == 2
