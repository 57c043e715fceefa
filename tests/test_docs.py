"""The docs' links: every relative link in README.md, CONTRIBUTING.md, docs/
and benchmarks/README.md names a file that exists, and a heading there where
it names one (the README was cut into guides; a moved section breaks links)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("**/*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (code blocks left out)."""
    anchors, code = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            code = not code
        elif not code and (m := re.match(r"#{1,6} (.*)", line)):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in LINK.findall(text) if not t.startswith(("http", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        missing = not where.exists()
        if missing or (
            anchor and where.suffix == ".md" and anchor not in _anchors(where)
        ):
            broken.append(target)
    assert not broken, broken


def readme_commands() -> list[str]:
    """README's copy-paste commands: each ```bash block before its first rule."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("\n---\n")[0]
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_the_readme_fits_a_screen_or_two_and_keeps_its_two_commands():
    """README starts with two commands (install and run the quickstart;
    install and run every test), each one line under 200 characters, and
    .ci/run runs the second verbatim, as its one command (issue 77)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in c and len(c) < 200 for c in commands), commands
    quickstart, tests = commands
    assert quickstart.endswith("examples/quickstart.py"), quickstart
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    run = [line for line in ci if line.strip() and not line.startswith("#")]
    assert run[-1] == tests, (run[-1], tests)
    # Before it, nothing but the shell's settings and the repository's root.
    assert ci[0] == "#!/usr/bin/env bash"
    assert run[:-1] == [
        "set -euo pipefail",
        'cd "$(dirname "$0")/.."',
    ], run


def test_readme_s_quickstart_runs_and_prints_its_plan(tmp_path):
    """README's first command ends in examples/quickstart.py: it must run,
    print the plan, and train the user's own model (about 10 s). On a fresh
    machine (an empty cache, TensorFlow's log level as the example leaves
    it) it prints nothing beyond TensorFlow's own start-up: kerascale's
    first measurements printed TensorFlow's retracing warning twice, which
    a newcomer read as a bug in their code (issue 55)."""
    import os
    import subprocess
    import sys

    import start_up

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**env, "KERASCALE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert start_up.said(done.stderr) == [], done.stderr[-3000:]
    assert "kerascale plan" in done.stdout
    accuracy = float(
        done.stdout.rsplit("accuracy of your model after", 1)[1].split()[-1]
    )
    assert accuracy > 0.9, done.stdout[-2000:]
