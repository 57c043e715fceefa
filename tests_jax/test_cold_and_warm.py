"""What kerascale measures leaves no trace in training, on JAX: the script
and its cases are tests_common/cold_and_warm.py's."""

import pytest
from cold_and_warm import cases, same, trained, unmeasured


@pytest.mark.once
@pytest.mark.nightly  # Keras 3.16 reads its build batch otherwise
@pytest.mark.parametrize("kind, limit", cases())
def test_a_cold_cache_and_a_warm_one_train_the_same_weights(
    kind, limit, tmp_path, monkeypatch
):
    """With a batch check, the run that measured has its model built, and
    reads the batch Keras's fit would have read to build it
    (`_keras_compat.ReadToBuild`): without it, every epoch trained the next
    one's order."""
    (cold, *warm), plain = trained(kind, limit, tmp_path, monkeypatch)
    assert any((tmp_path / "cache").iterdir())  # the first put its answers there
    assert unmeasured(cold) == [], cold["reasons"]
    assert all(same(cold, run) for run in warm)
    assert same(cold, plain, exact=False)  # plain fit's: float32, the batch kept
