"""Whether a process of this machine is alive: what it left (a lease, a
shard being written, a compile cache) is kept while it is."""

from __future__ import annotations

import os
from typing import Any


def alive(pid: Any) -> bool:
    """Whether process `pid` of this machine is alive (signal 0 reaches it,
    or it belongs to another user: kept); False for no process id."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process, or not ours to ask
    return True
