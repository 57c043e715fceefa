"""The documentation site builds with --strict (mkdocs.yml): every page in
the nav, every link between pages and to their headings, and every
reference page generated from the docstrings."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    home = (tmp_path / "index.html").read_text("utf-8")
    assert "Before and after" in home and "What it decides" in home  # README
    reference = (tmp_path / "reference" / "kerascale" / "index.html").read_text()
    assert "find_batch_size" in reference and "memory_limit" in reference
    # A guide's link out of docs/ leads to the page that file became.
    assert 'href="../benchmarks/' in (tmp_path / "jax" / "index.html").read_text()
