"""The backup's writer (`kerascale.callbacks._backup_writer`) on its own:
no backend is involved."""

import threading
import time

from kerascale.callbacks import _backup_writer as writer_lib


def test_wait_all_waits_for_a_write_another_thread_is_collecting():
    """A plain fit that raised is settled by the run's watcher thread
    (`release`, waiting for the save in flight) while the next run's
    `on_train_begin` calls `wait_all` on the main thread: that must wait
    for the write too, or the next run clears the directory under it (a
    fresh clone's run: FileNotFoundError on the save's meta.json.tmp)."""
    may_end = threading.Event()
    writer = writer_lib.Writer()

    def write():
        assert may_end.wait(10)
        return "published"

    writer.start(7, write)
    collected = []
    watcher = threading.Thread(target=lambda: collected.append(writer.wait()))
    watcher.start()
    time.sleep(0.1)  # the watcher is in wait(), joining the write
    waiting = threading.Thread(target=writer_lib.wait_all)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive(), "wait_all returned while the save was being written"
    may_end.set()
    waiting.join(5)
    watcher.join(5)
    assert not waiting.is_alive() and not watcher.is_alive()
    (outcome,) = collected
    assert (outcome.number, outcome.path, outcome.error) == (7, "published", None)
    assert writer.wait() is None  # collected once


def test_a_write_that_raises_is_delivered_to_the_collector():
    writer = writer_lib.Writer()

    def write():
        raise OSError("disk full")

    writer.start(3, write)
    outcome = writer.wait()
    assert outcome.number == 3 and outcome.path is None
    assert isinstance(outcome.error, OSError) and "disk full" in str(outcome.error)
