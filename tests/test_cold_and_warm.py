"""What kerascale measures leaves no trace in training, on TensorFlow: the
script and its cases are tests_common/cold_and_warm.py's."""

import pytest
from cold_and_warm import cases, same, trained, unmeasured


@pytest.mark.once
@pytest.mark.parametrize("kind, limit", cases())
def test_a_cold_cache_and_a_warm_one_train_the_same_weights(
    kind, limit, tmp_path, monkeypatch
):
    """The trials' copies read a seeded tf.data pipeline through a copy with
    seed generators of its own (`_tf_compat.unshared_dataset`)."""
    (cold, *warm), plain = trained(kind, limit, tmp_path, monkeypatch)
    assert any((tmp_path / "cache").iterdir())  # the first put its answers there
    assert unmeasured(cold) == [], cold["reasons"]
    assert all(same(cold, run) for run in warm)
    assert same(cold, plain, exact=False)  # plain fit's: float32, the batch kept
