"""The documentation site builds with --strict (mkdocs.yml): every page in
the nav, every link between pages and to their headings, and every
reference page generated from the docstrings."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.docs  # the docs lane


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
    # Inspecting the package runs none of it (kerascale/__main__.py ran the
    # CLI on mkdocs's own arguments when imported).
    assert "usage: kerascale" not in done.stdout + done.stderr
    home = (tmp_path / "index.html").read_text("utf-8")
    assert "Before and after" in home and "What it decides" in home  # README
    reference = (tmp_path / "reference" / "kerascale" / "index.html").read_text()
    assert "find_batch_size" in reference and "memory_limit" in reference
    # A guide's link out of docs/ leads to the page that file became.
    assert 'href="../benchmarks/' in (tmp_path / "jax" / "index.html").read_text()


def test_every_list_is_a_list_on_the_site():
    """Python-Markdown (mkdocs) reads a list only after a blank line, and a
    nested list only at 4 spaces: otherwise it renders the items as text of
    the paragraph before (GitHub renders both)."""
    import re

    pages = [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "benchmarks/README.md",
    ]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    broken = []
    for page in pages:
        lines, fenced = page.read_text("utf-8").split("\n"), False
        for i, line in enumerate(lines[1:], 1):
            fenced ^= line.startswith("```")
            previous = lines[i - 1]
            if fenced or not re.match(r"^( {0,3})(- |\d+\. )", line):
                continue
            after_text = previous.strip() and not re.match(
                r"^(\s|- |\d+\. |\|)", previous
            )
            if after_text or re.match(r"^ {1,3}- ", line):
                broken.append(f"{page.relative_to(ROOT)}:{i + 1}: {line[:50]}")
    assert not broken, broken
