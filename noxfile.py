"""The suite's lanes, one nox session each.

    nox -l                                  the lanes
    nox                                     every lane, in the order CI runs them
    nox -s tf -- tests/test_backup.py -k resume    one file of one lane
    nox -s quick                            the inner loop: both backends' fast tests

A lane selects tests by their markers (pyproject.toml; CONTRIBUTING.md says
which marker a new test needs) and runs them in one of two environments that
the lanes share, made with uv and updated when pyproject.toml changes:
`.venv` (TensorFlow, and JAX beside it) and `.venv-jax` (JAX without
TensorFlow: a JAX user's install). The nightly lanes put keras-nightly first on
PYTHONPATH over each environment's Keras (`.keras-next`). Arguments after `--`
replace the lane's paths and its workers (`-n 2`): a file, `-k`, `-x`, ...
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "uv"

ROOT = Path(__file__).resolve().parent
# The next Keras the nightly lanes test (kerascale/_keras_compat/status.py's
# TESTED names it too).
KERAS_NEXT = "keras-nightly==3.16.0.dev2026102704"
RUFF = "ruff==0.17.6"
# Two workers: the machine CI runs on has 2 cores, and the suite is bound by
# them (a third worker took longer). Tests are handed out one at a time, the
# long ones first (tests_common/lanes.py), but those that share a module's
# fixture or cache are marked `xdist_group` and stay on one worker.
WORKERS = ("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
ENVIRONMENTS = {"tf": (".venv", "test"), "jax": (".venv-jax", "test-jax")}
# JAX on 2 forced CPU devices (the jax_serial and jax_2dev lanes).
TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
# Each lane adds its counts here (tests_common/lanes.py); `tally`, the last
# session, sums this run's into one closing line.
TALLY = ROOT / ".nox" / f"tally-{os.getpid()}.jsonl"


def _uv() -> str:
    from uv import find_uv_bin  # nox[uv] brings it

    return find_uv_bin()


def environment(session: nox.Session, name: str) -> str:
    """The shared environment `name`'s python, made or updated first where
    pyproject.toml changed since it was installed (a stamp file says)."""
    folder, extra = ENVIRONMENTS[name]
    venv = ROOT / folder
    python = venv / "bin" / "python"
    stamp = venv / ".kerascale-installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    wanted = f"{extra} {digest}"
    if not python.exists():
        base = os.path.realpath(sys.executable)  # nox's own interpreter, not its venv
        session.run(_uv(), "venv", "-q", "--python", base, str(venv), external=True)
    if not stamp.exists() or stamp.read_text() != wanted:
        session.run(
            _uv(), "pip", "install", "-q", "--python", str(python),
            "--compile-bytecode", "-e", f".[{extra}]", external=True,
        )  # fmt: skip
        stamp.write_text(wanted)
    return str(python)


def keras_next(session: nox.Session, python: str) -> dict[str, str]:
    """keras-nightly in `.keras-next` (no dependencies: each environment's
    own serve it), and the environment that puts it first in this process and
    every child; tests_common/keras_lane.py stops a run that imported another."""
    target = ROOT / ".keras-next"
    version = KERAS_NEXT.split("==")[1]
    if not list(target.glob(f"keras_nightly-{version}.dist-info")):
        session.run(
            _uv(), "pip", "install", "-q", "--python", python, "--no-deps",
            "--compile-bytecode", "--target", str(target), KERAS_NEXT, external=True,
        )  # fmt: skip
    return {"PYTHONPATH": str(target), "KERASCALE_EXPECT_KERAS": version}


def pytest(
    session: nox.Session,
    env: str,
    marks: str | None,
    *args: str,
    paths: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    python: str | None = None,
    replace: bool = True,
) -> None:
    """pytest in environment `env`, on the tests marked `marks`: the lane's
    `paths` and `args`, or the arguments after `--` in their place (added to
    them where not `replace`)."""
    python = python or environment(session, env)
    chosen = [*args, *paths]
    if session.posargs:
        chosen = session.posargs if replace else [*chosen, *session.posargs]
    selection = ["-m", marks] if marks else []
    session.run(
        python, "-m", "pytest", *selection, *chosen,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "KERASCALE_LANE": session.name,
             "KERASCALE_TALLY": str(TALLY), **(extra_env or {})},
        external=True,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: the lint rules and the formatting (pyproject.toml's [tool.ruff])."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=False)
def tf_serial(session: nox.Session) -> None:
    """TensorFlow: the tests that time something (marked serial), alone."""
    pytest(session, "tf", "serial", paths=("tests",))


@nox.session(python=False)
def tf_cluster(session: nox.Session) -> None:
    """TensorFlow: real clusters and leases (marked cluster), two at a time."""
    # Three at a time took as long (133 s against 135 s): the tests slowed,
    # and a module's fixture was made once a worker.
    pytest(session, "tf", "cluster", *WORKERS, paths=("tests",))


@nox.session(python=False)
def tf(session: nox.Session) -> None:
    """TensorFlow (JAX beside it): every other test of tests/, two at a time."""
    marks = "not serial and not cluster and not docs"
    pytest(session, "tf", marks, *WORKERS, paths=("tests",))


@nox.session(python=False)
def jax_serial(session: nox.Session) -> None:
    """JAX without TensorFlow: the tests that time something, alone, 1 and 2 devices."""
    pytest(session, "jax", "serial", paths=("tests_jax",))
    pytest(session, "jax", "serial", paths=("tests_jax",), extra_env=TWO_DEVICES)


@nox.session(python=False)
def jax(session: nox.Session) -> None:
    """JAX without TensorFlow, on 1 CPU device."""
    pytest(session, "jax", "not serial", *WORKERS, paths=("tests_jax",))


@nox.session(python=False)
def jax_2dev(session: nox.Session) -> None:
    """JAX without TensorFlow, on 2 forced CPU devices (tests marked once skip)."""
    pytest(
        session, "jax", "not serial", *WORKERS,
        paths=("tests_jax",), extra_env=TWO_DEVICES,
    )  # fmt: skip


@nox.session(python=False)
def nightly_jax(session: nox.Session) -> None:
    """keras-nightly on JAX (no TensorFlow): the tests marked nightly, no kills
    or timings."""
    python = environment(session, "jax")
    pytest(
        session, "jax", "nightly and not kill and not serial", *WORKERS,
        paths=("tests_jax",), extra_env=keras_next(session, python), python=python,
    )  # fmt: skip


@nox.session(python=False)
def nightly_tf(session: nox.Session) -> None:
    """keras-nightly on TensorFlow: the tests marked nightly, no kills or timings."""
    python = environment(session, "tf")
    pytest(
        session, "tf", "nightly and not cluster and not kill and not serial",
        *WORKERS, paths=("tests",),
        extra_env=keras_next(session, python), python=python,
    )  # fmt: skip


@nox.session(python=False)
def docs(session: nox.Session) -> None:
    """The documentation site builds with --strict (tests marked docs)."""
    # Keras on JAX (in .venv beside TensorFlow): this pytest process then
    # starts without TensorFlow's 5 s import (mkdocs, in its own process,
    # still imports it while reading kerascale's docstrings).
    jax = {"KERAS_BACKEND": "jax"}
    pytest(session, "tf", "docs", paths=("tests/test_docs_site.py",), extra_env=jax)


@nox.session(python=False)
def tally(session: nox.Session) -> None:
    """The run's tests over every lane, in one closing line (last in a bare run)."""
    lanes = []
    if TALLY.exists():
        lanes = [json.loads(line) for line in TALLY.read_text().splitlines()]
        TALLY.unlink()
    total = {k: sum(r[k] for r in lanes) for k in ("passed", "failed", "skipped")}
    session.log(f"{len(lanes)} pytest runs: " + ", ".join(r["lane"] for r in lanes))
    print(
        f"suite: {total['passed']} passed, {total['failed']} failed, "
        f"{total['skipped']} skipped",
        flush=True,
    )


@nox.session(python=False, default=False)
def quick(session: nox.Session) -> None:
    """The inner loop, under 3 minutes: both backends' fast tests.

    The tests recorded under 1 s, none that times, starts a cluster or kills
    (tests_common/lanes.py).
    Arguments after `--` are added to both runs (`-x`, `-k plan`)."""
    fast = ("--quick", *WORKERS)
    pytest(session, "tf", "not docs", *fast, paths=("tests",), replace=False)
    pytest(session, "jax", "not serial", *fast, paths=("tests_jax",), replace=False)
