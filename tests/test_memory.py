"""`memory.planning`: planning's garbage collections walk only what planning
made, and the heap is as it was once the region ends, however it ends."""

import gc

import pytest

from kerascale.sense import memory


@pytest.fixture(autouse=True)
def _unfrozen():
    """The suite's conftest freezes what collection imported; these tests
    start from a heap nobody froze, and the suite's is frozen again after."""
    gc.unfreeze()
    yield
    gc.collect()
    gc.freeze()


class _Cycle:
    def __init__(self):
        self.me = self


def _collected(ref_list):
    return all(r() is None for r in ref_list)


def test_a_region_freezes_at_its_first_collection_and_unfreezes_at_its_end():
    import weakref

    before = _Cycle()
    dropped_before = weakref.ref(before)
    del before  # garbage from before the region: the first collection is full
    assert gc.get_freeze_count() == 0
    with memory.planning():
        assert gc.get_freeze_count() == 0  # nothing frozen until it collects
        memory.collect()
        assert _collected([dropped_before])
        frozen = gc.get_freeze_count()
        assert frozen > 0
        made = _Cycle()
        dropped_inside = weakref.ref(made)
        del made
        kept = [[] for _ in range(1000)]  # made inside, alive
        memory.collect()  # of what the region made
        assert _collected([dropped_inside])
        # Nothing more frozen (a frozen object can still be freed by its
        # reference count, so the count may fall, never rise by `kept`).
        assert gc.get_freeze_count() <= frozen
        del kept
        left = _Cycle()
        left_behind = weakref.ref(left)
        del left  # garbage the region leaves: collected at its end
    assert _collected([left_behind])
    assert gc.get_freeze_count() == 0


def test_a_region_that_raises_unfreezes_and_nested_regions_unfreeze_once():
    with pytest.raises(RuntimeError), memory.planning():
        with memory.planning():
            memory.collect()
        assert gc.get_freeze_count() > 0  # the outer region still holds
        raise RuntimeError("planning failed")
    assert gc.get_freeze_count() == 0


def test_a_heap_the_user_froze_stays_frozen_and_is_not_unfrozen():
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        with memory.planning():
            kept = [[] for _ in range(1000)]
            memory.release_freed()
        # Not unfrozen (0), and nothing more frozen (`kept` would add 1000;
        # a frozen object freed by its reference count lowers the count).
        assert 0 < gc.get_freeze_count() <= theirs
        del kept
    finally:
        gc.unfreeze()


def test_a_region_that_collects_nothing_freezes_nothing():
    with memory.planning():
        pass
    assert gc.get_freeze_count() == 0


def test_a_search_in_a_fresh_process_freezes_while_it_plans_and_unfreezes(tmp_path):
    """The region on the real path, where no conftest froze the heap: the
    search's collections run on a frozen heap, and nothing stays frozen."""
    import os
    import subprocess
    import sys

    script = (
        "import gc, numpy as np, keras, kerascale\n"
        "seen = []\n"
        "gc.callbacks.append(lambda phase, info: seen.append(gc.get_freeze_count()))\n"
        "model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])\n"
        "model.compile('adam', 'mse')\n"
        "x, y = np.zeros((512, 8), 'float32'), np.zeros((512, 4), 'float32')\n"
        "found = kerascale.find_batch_size(model, x, y, mode='throughput',\n"
        "                                  precision='float32', verbose=0)\n"
        "print(found.batch_size, max(seen), gc.get_freeze_count())\n"
    )
    env = {
        **os.environ,
        "KERASCALE_CACHE_DIR": str(tmp_path),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    batch, most_frozen, frozen_after = map(int, done.stdout.split()[-3:])
    assert batch >= 1
    assert most_frozen > 100_000  # TensorFlow's and Keras's objects, out of sight
    assert frozen_after == 0
