"""The suite's lanes (issue 77): a test's lane is its markers; the order
tests are handed out in and the quick lane's selection come from recorded
durations (tests_common/lanes.py), and README, .ci/run and noxfile.py agree."""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lanes
import pytest

ROOT = Path(__file__).resolve().parent.parent


class Item:
    """What lanes.py reads of a pytest item."""

    def __init__(self, nodeid, *marks, group=None):
        self.nodeid = nodeid
        self.path = Path(nodeid.split("::")[0])
        self.marks = marks
        self.group = group

    def get_closest_marker(self, name):
        if name == "xdist_group":
            return pytest.mark.xdist_group(self.group).mark if self.group else None
        return name if name in self.marks else None


def test_long_tests_are_handed_out_first_and_the_rest_keep_their_order():
    items = [Item(f"t.py::{n}") for n in "abcde"]
    seconds = {"t.py::b": 6.0, "t.py::d": 30.0, "t.py::e": 4.9, "t.py::x": 99.0}
    lanes.handed_out_order(items, seconds, "load")
    assert [i.nodeid[-1] for i in items] == ["d", "b", "a", "c", "e"]


def test_a_group_is_handed_out_by_its_tests_total():
    items = [
        Item("a.py::1"),
        Item("b.py::1", group="b"),
        Item("a.py::2"),
        Item("b.py::2", group="b"),
        Item("c.py::1"),
    ]
    seconds = {"a.py::1": 7.0, "b.py::1": 4.0, "b.py::2": 4.0, "c.py::1": 1.0}
    lanes.handed_out_order(items, seconds, "loadgroup")
    assert [i.nodeid for i in items] == [
        "b.py::1", "b.py::2", "a.py::1", "a.py::2", "c.py::1",
    ]  # fmt: skip


def test_whole_files_are_handed_out_longest_first_under_loadfile():
    items = [Item(n) for n in ("a.py::1", "a.py::2", "b.py::1", "c.py::1")]
    seconds = {"a.py::1": 2.0, "a.py::2": 2.0, "b.py::1": 9.0, "c.py::1": 1.0}
    lanes.handed_out_order(items, seconds, "loadfile")
    assert [i.nodeid for i in items] == ["b.py::1", "a.py::1", "a.py::2", "c.py::1"]


def test_quick_is_recorded_under_a_second_and_never_marked_slow():
    seconds = {"t.py::fast": 0.2, "t.py::slow": 3.0}
    assert lanes.is_quick(Item("t.py::fast"), seconds)
    assert lanes.is_quick(Item("t.py::new"), seconds)  # not recorded yet
    assert not lanes.is_quick(Item("t.py::slow"), seconds)
    for mark in lanes.NOT_QUICK:
        assert not lanes.is_quick(Item("t.py::fast", mark), seconds)


def test_a_lane_s_own_durations_count_over_another_s(tmp_path, monkeypatch):
    table = {"jax": {"t.py::a": 1.0}, "jax_2dev": {"t.py::a": 8.0, "t.py::b": 2.0}}
    assert lanes.longest(table) == {"t.py::a": 8.0, "t.py::b": 2.0}
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps(table))
    monkeypatch.setattr(lanes, "DURATIONS", durations)
    assert lanes.recorded() == table
    durations.write_text("{not json")
    assert lanes.recorded() == {}


def test_a_run_records_its_lane_s_durations_and_keeps_the_others(tmp_path):
    """`--record-durations` writes this lane's part of durations.json (in a
    pytest run of its own, on a test file written here), forgetting the
    tests of the files it ran that are gone."""
    (tmp_path / "test_two.py").write_text(
        "import time\n\n"
        "def test_sleeps():\n    time.sleep(0.3)\n\n"
        "def test_returns():\n    pass\n"
    )
    durations = tmp_path / "durations.json"
    # A test of test_two.py that is gone (renamed), and one of a file that
    # did not run: the first is dropped, the second kept.
    durations.write_text(
        json.dumps(
            {
                "other": {"x.py::y": 1.0},
                "mine": {"test_two.py::test_gone": 9.0, "z.py::w": 2.0},
            }
        )
    )
    (tmp_path / "conftest.py").write_text(
        "from pathlib import Path\n\nimport lanes\n\n"
        f"lanes.DURATIONS = Path({str(durations)!r})\n"
        'pytest_plugins = ["lanes"]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--record-durations",
         "-q", "-p", "no:cacheprovider", "test_two.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(Path(lanes.__file__).parent),
             "KERASCALE_LANE": "mine", "PATH": "/usr/bin:/bin",
             "KERASCALE_TALLY": str(tmp_path / "tally.jsonl")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table = json.loads(durations.read_text())
    assert table["other"] == {"x.py::y": 1.0}
    assert set(table["mine"]) == {
        "test_two.py::test_sleeps",
        "test_two.py::test_returns",
        "z.py::w",
    }
    assert table["mine"]["test_two.py::test_sleeps"] >= 0.3
    # Its counts for the run's closing line (noxfile.py's tally session).
    tally = json.loads((tmp_path / "tally.jsonl").read_text())
    assert tally == {"lane": "mine", "passed": 2, "failed": 0, "skipped": 0}


def test_no_table_of_test_names_decides_a_lane():
    """Lanes are markers on the tests: the conftests and the lanes' plugin
    hold no list of test names (a renamed test would leave its lane
    silently), and add no lane's marker themselves."""
    for path in [
        ROOT / "conftest.py",
        ROOT / "tests" / "conftest.py",
        ROOT / "tests_jax" / "conftest.py",
        Path(lanes.__file__),
    ]:
        text = path.read_text()
        for mark in ("serial", "cluster", "nightly", "kill", "once", "docs"):
            assert f"add_marker(pytest.mark.{mark}" not in text, (path, mark)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith("test_") or " " in node.value, (
                    f"{path.name} names a test: {node.value!r}"
                )


def test_every_lane_marker_is_registered_and_noxfile_lists_the_lanes():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ini = config["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in ini["addopts"]
    registered = {m.split(":")[0] for m in ini["markers"]}
    assert {"serial", "cluster", "kill", "once", "nightly", "docs"} <= registered
    noxfile = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = {
        f.name
        for f in noxfile.body
        if isinstance(f, ast.FunctionDef)
        and any("session" in ast.unparse(d) for d in f.decorator_list)
    }
    assert sessions == {
        "lint", "tf_serial", "tf_cluster", "tf", "jax_serial", "jax", "jax_2dev",
        "nightly_jax", "nightly_tf", "docs", "tally", "quick",
    }  # fmt: skip


def test_a_child_that_hangs_is_dumped_before_it_is_killed():
    """tests_common/stuck.py: the failure names where the child waits."""
    import stuck

    sleeper = [sys.executable, "-c", "import time\ntime.sleep(60)"]
    with pytest.raises(stuck.Stuck, match="did not end in 1 s") as e:
        stuck.run(sleeper, timeout=1)
    assert "Thread " in str(e.value) and "time_sleep" in str(e.value), str(e.value)
    if shutil.which("gdb"):  # every native thread, one line each, innermost first
        assert re.search(r'Thread 1 "python": \S*sleep', str(e.value)), str(e.value)
    done = stuck.run([sys.executable, "-c", "print('ok')"], timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n")


def test_xdist_s_controller_leaves_what_the_conftests_import_lazily(tmp_path):
    """A conftest's `lazy.module` is imported where a test first reads it, in
    xdist's worker, never in its controller (which runs no test), and
    `lazy.in_controller` tells them apart: a real `pytest -n 1` run, laid out
    as this repository is (a root conftest, the suite's own in tests/)."""
    suite = tmp_path / "tests"
    suite.mkdir()
    (tmp_path / "conftest.py").write_text('"""The root conftest."""\n')
    (tmp_path / "heavy.py").write_text(
        "import os\nfrom pathlib import Path\n\n"
        "Path(f'imported-in-{os.getpid()}').touch()\nVALUE = 3\n"
    )
    (suite / "conftest.py").write_text(
        "import os\nfrom pathlib import Path\n\nimport lazy\n\n"
        'heavy = lazy.module("heavy")\n\n\n'
        "def pytest_sessionstart(session):\n"
        "    role = 'controller' if lazy.in_controller(session.config) else 'worker'\n"
        "    Path(f'{role}-{os.getpid()}').touch()\n"
    )
    (suite / "test_one.py").write_text(
        "from conftest import heavy\n\n\n"
        "def test_reads_it():\n    assert heavy.VALUE == 3\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-q", "-p", "no:cacheprovider",
         "tests"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{tmp_path}:{Path(lanes.__file__).parent}",
             "PATH": "/usr/bin:/bin", "KERASCALE_TALLY": str(tmp_path / "t")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    roles = ("controller-", "worker-", "imported-in-")
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(roles))
    assert len(names) == 3, names  # one each: imported once
    made = dict(name.rsplit("-", 1) for name in names)  # role: its process id
    assert made["imported-in"] == made["worker"] != made["controller"]


def test_a_lazy_module_is_the_module_once_read(tmp_path, monkeypatch):
    import lazy

    (tmp_path / "lazily_read.py").write_text(
        "import sys\nsys.lazily_ran = True\nX = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delattr(sys, "lazily_ran", raising=False)
    found = lazy.module("lazily_read")
    try:
        assert not hasattr(sys, "lazily_ran")  # found, not run
        assert found.X == 1 and sys.lazily_ran
        assert lazy.module("lazily_read") is found is sys.modules["lazily_read"]
        with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
            lazy.module("no_such_module_here")
    finally:
        sys.modules.pop("lazily_read", None)
        monkeypatch.delattr(sys, "lazily_ran", raising=False)
