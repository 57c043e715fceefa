"""`memory.planning`'s cases on a heap nobody froze: run by
tests/test_memory.py in a fresh pytest process without the suites'
conftests (which freeze the heap between tests, and whose unfreezing frees
at once all that a worker's tests left frozen: 77 s once)."""

import gc

import pytest

from kerascale.sense import memory


@pytest.fixture(autouse=True)
def _unfrozen():
    """Each case starts from a heap nobody froze (so does this process)."""
    assert gc.get_freeze_count() == 0
    yield


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
