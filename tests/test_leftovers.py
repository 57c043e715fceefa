"""What a killed process leaves in the temporary directory is removed by
the next one; what a living one holds is kept, whatever PID namespace it is
in (`kerascale/_pids.py`)."""

import os
import subprocess
import sys
import time

from kerascale import _pids


def test_a_worker_s_save_directory_is_its_own_and_a_killed_one_s_is_swept(
    monkeypatch, tmp_path
):
    """A non-chief worker writes each checkpoint into a temporary directory
    of its own: named by its process, locked while it writes, removed after.
    One left by a worker killed mid-save is removed by the next save."""
    monkeypatch.setattr(_pids.tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    killed = tmp_path / f"kerascale-worker-{gone.stdout.strip()}-abc"
    killed.mkdir()
    (killed / ".owner").write_text("")  # its lock, released by its death
    (killed / "ckpt-3").write_bytes(b"x" * 1024)
    unnamed_old = tmp_path / "kerascale-worker-0frpcgdg"  # an older kerascale's
    unnamed_new = tmp_path / "kerascale-worker-7o1zq172"
    for d in (unnamed_old, unnamed_new):
        d.mkdir()
    os.utime(unnamed_old, (time.time() - 7200, time.time() - 7200))
    with _pids.own_directory("kerascale-worker-") as path:
        assert not killed.exists() and not unnamed_old.exists()
        assert unnamed_new.exists()  # it may be being written
        assert os.path.basename(path).startswith(f"kerascale-worker-{os.getpid()}-")
        assert _pids.owner_alive(path) is True  # another process sees it held
    assert not os.path.exists(path)
