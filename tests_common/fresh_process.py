"""Python code run in a fresh interpreter, for what only a new process shows
(its resident memory, the modules an import pulls in)."""

import json
import subprocess
import sys


def run(code: str, timeout: float = 120) -> str:
    """Runs `code` with this interpreter; its stdout (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def last_json(code: str, timeout: float = 120):
    """Runs `code`; the JSON of the last line it printed."""
    return json.loads(run(code, timeout).strip().splitlines()[-1])
