"""A truth child's early stop: past a limit, its peak is all it has to
tell (tests/user_process_child.py, tests_jax/memory_child.py)."""

import json
import os
import threading
import time


def stop_above(limit: int) -> None:
    """Watches this process's peak resident memory (VmHWM) from a thread:
    past `limit`, prints it as JSON ("stopped": true) and exits at once."""
    from kerascale.sense import memory

    def watch():
        while True:
            peak = memory.resident_peak_bytes() or 0
            if peak > limit:
                print(json.dumps({"peak": peak, "stopped": True}), flush=True)
                os._exit(0)
            time.sleep(0.002)

    threading.Thread(target=watch, daemon=True).start()
