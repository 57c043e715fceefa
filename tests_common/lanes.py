"""The suite's lanes, as a pytest plugin both suites load (the root conftest).

Which lane a test runs in is a marker written on the test or its module
(`serial`, `cluster`, `kill`, `once`, `nightly`: pyproject.toml says what each
means; noxfile.py's sessions select by them). This plugin adds what is
derived, not written by hand: the order tests are handed to pytest-xdist's
workers and the `quick` lane's selection, both from the durations the suite
itself recorded (`durations.json` beside this file; `--record-durations`, or
KERASCALE_RECORD_DURATIONS=1, rewrites the running lane's part of it).

A test that is renamed or new has no recorded duration: it keeps its lane (its
markers), is handed out in collection order, and counts as quick until the
next recording says otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
# pytest-xdist hands out tests in collection order (noxfile.py runs it with
# `--dist loadgroup --no-loadscope-reorder`: a test at a time, but the tests
# of one `xdist_group` together): a long test handed out last keeps one worker
# busy while the other has nothing left. Tests (or groups) of at least LONG
# seconds go first, longest first; the rest keep their order.
LONG = 5.0
# The quick lane: tests recorded under QUICK seconds in every lane, and none
# that starts processes, times something or kills (those are marked).
QUICK = 1.0
NOT_QUICK = ("serial", "cluster", "kill", "gpu")


def pytest_addoption(parser):
    group = parser.getgroup("kerascale lanes (tests_common/lanes.py)")
    group.addoption(
        "--quick",
        action="store_true",
        help=f"only the tests recorded under {QUICK} s, none marked "
        f"{', '.join(NOT_QUICK)} (noxfile.py's quick session)",
    )
    group.addoption(
        "--record-durations",
        action="store_true",
        default=os.environ.get("KERASCALE_RECORD_DURATIONS") == "1",
        help=f"write this lane's test durations into {DURATIONS.name} "
        "(the lane's name: KERASCALE_LANE, set by noxfile.py)",
    )


def lane() -> str:
    """The running lane's name (noxfile.py sets it; a bare pytest is 'pytest')."""
    return os.environ.get("KERASCALE_LANE", "pytest")


def recorded() -> dict[str, dict[str, float]]:
    """Each lane's recorded durations: {lane: {node id: seconds}}."""
    try:
        return json.loads(DURATIONS.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def longest(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each test's longest recorded duration, in any lane."""
    most: dict[str, float] = {}
    for durations in table.values():
        for node, s in durations.items():
            most[node] = max(s, most.get(node, 0.0))
    return most


def scope(item, dist: str) -> str:
    """What xdist hands out whole: under `loadfile` the file, under
    `loadgroup` the test's `xdist_group` (or the test alone)."""
    if dist == "loadfile":
        return str(item.path)
    group = item.get_closest_marker("xdist_group") if dist == "loadgroup" else None
    if group is not None:
        return str(group.kwargs.get("name", group.args[0] if group.args else ""))
    return item.nodeid


def handed_out_order(items: list, seconds: dict[str, float], dist: str) -> None:
    """Sorts `items` in place: what xdist hands out whole (`scope`) of at
    least LONG seconds first, longest first; the rest in their order (the
    sort is stable)."""
    scopes = {id(item): scope(item, dist) for item in items}
    total: dict[str, float] = {}
    for item in items:
        key = scopes[id(item)]
        total[key] = total.get(key, 0.0) + seconds.get(item.nodeid, 0.0)

    def rank(item) -> float:
        s = total[scopes[id(item)]]
        return -s if s >= LONG else 0.0

    items.sort(key=rank)


def is_quick(item, seconds: dict[str, float]) -> bool:
    if any(item.get_closest_marker(name) for name in NOT_QUICK):
        return False
    return seconds.get(item.nodeid, 0.0) < QUICK


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    table = recorded()
    if config.getoption("quick"):
        most = longest(table)  # quick is quick in every lane
        dropped = [item for item in items if not is_quick(item, most)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if is_quick(item, most)]
    if getattr(config.option, "numprocesses", None):
        # This lane's own figures where it has them (a 2-device lane's JAX
        # tests run longer than the 1-device lane's), else any lane's.
        seconds = {**longest(table), **table.get(lane(), {})}
        handed_out_order(items, seconds, getattr(config.option, "dist", "load"))


def pytest_configure(config):
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(config), "kerascale-durations")


class _Recorder:
    """Adds up each test's setup, call and teardown, and writes the lane's
    part of durations.json at the end (in the controller: xdist's workers'
    reports arrive there too)."""

    def __init__(self, config):
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + (
            report.duration
        )

    def pytest_sessionfinish(self, session, exitstatus):
        if not self.seconds or self.config.getoption("quick"):
            return
        table = recorded()
        # A test no longer reported from a file this run ran was removed or
        # renamed (or deselected by -k: it only loses its place in the order).
        ran = {node.split("::")[0] for node in self.seconds}
        mine = {
            node: s
            for node, s in table.get(lane(), {}).items()
            if node.split("::")[0] not in ran
        }
        mine.update({node: round(s, 2) for node, s in self.seconds.items()})
        table[lane()] = dict(sorted(mine.items()))
        DURATIONS.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Adds this lane's counts to the run's tally (KERASCALE_TALLY, a file
    noxfile.py names), which its last session sums into one closing line."""
    tally = os.environ.get("KERASCALE_TALLY")
    if not tally or hasattr(config, "workerinput"):
        return
    stats = terminalreporter.stats
    counts = {k: len(stats.get(k, ())) for k in ("passed", "failed", "skipped")}
    counts["failed"] += len(stats.get("error", ()))
    os.makedirs(os.path.dirname(tally), exist_ok=True)  # a fresh clone's first lane
    with open(tally, "a") as f:
        f.write(json.dumps({"lane": lane(), **counts}) + "\n")
