import json
import os
import subprocess
import sys

import fresh_process
import pytest

import kerascale
from kerascale import cli


@pytest.mark.nightly  # the doctor reports this Keras's fixes
def test_doctor_prints_hardware_and_decisions(capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kerascale ")
    assert "hardware: CPU (" in out
    assert "strategy   default (1 replica)" in out
    assert "batch      32 x 1 x 1 = 32" in out
    assert "precision  " in out
    # What a bug report needs (issue 41): versions, memory, the cache folder.
    import keras

    assert f"keras {keras.__version__}" in out and "python 3." in out
    assert "memory:" in out and "cache:" in out and "For a bug report" in out


@pytest.mark.nightly  # the doctor reports this Keras's fixes
def test_doctor_json(capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hardware"]["cpu"]["cores"] >= 1
    assert report["error"] is None
    plan = report["default_plan"]
    assert plan["strategy"] == "default"
    # A CPU trains float32 by the rule, bf16 math or not (bf16 only where
    # the trials time it faster on the model, which the doctor has not).
    assert plan["precision"] == "float32"
    assert plan["reasons"]["precision"]
    env = report["environment"]
    assert env["versions"]["keras"] and env["cache_dir"]


def test_doctor_reports_a_malformed_cluster_instead_of_crashing(capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{bad")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "cluster:  TF_CONFIG: error: TF_CONFIG is not valid JSON" in out
    assert "No default plan: ClusterConfigError" in out


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["frobnicate"])
    assert e.value.code == 2


def test_python_dash_m_and_console_script_entry():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    # What the `kerascale` command runs (pyproject's [project.scripts]).
    entry = "import sys, kerascale_cli; sys.exit(kerascale_cli.main())"
    proc = subprocess.run(
        [sys.executable, "-c", entry, "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["default_plan"]["strategy"] == "default"


def test_help_and_version_answer_without_keras_or_a_backend():
    """`kerascale --help` (and --version, and a subcommand's --help) parse
    the command line without importing the package, so without Keras and
    TensorFlow or JAX (3.7 s before, 0.04 s now); every flag has its help."""
    code = (
        "import sys, kerascale_cli\n"
        "for argv in (['--help'], ['--version'], ['find-batch', '--help']):\n"
        "    try:\n"
        "        kerascale_cli.main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "heavy = ('keras', 'tensorflow', 'jax', 'kerascale')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = fresh_process.run(code, timeout=60)
    assert "usage: kerascale" in out
    assert kerascale.__version__ in out
    assert out.strip().splitlines()[-1] == "['kerascale._version', 'kerascale.cli']"
    undocumented = [
        (name, action.option_strings or action.dest)
        for name, sub in cli.build_parser()
        ._subparsers._group_actions[0]
        .choices.items()
        for action in sub._actions
        if not action.help
    ]
    assert undocumented == []


def _save_dense(path):
    import keras

    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8)(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.save(path)


def test_find_batch_json(tmp_path, capsys):
    path = tmp_path / "m.keras"
    _save_dense(path)
    code = cli.main(
        [
            "find-batch",
            str(path),
            "--input-shape",
            "6",
            "--max-batch-size",
            "16",
            "--memory-limit",
            "8GiB",
            "--precision",
            "float32",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch_size"] == 16
    assert report["smallest_failing"] is None
    assert {p["outcome"] for p in report["probes"]} == {"ok"}
    assert report["reasons"]["isolate"] == "each probe in a child process"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--input-shape", "0,3"], "--input-shape must be positive ints"),
        (["--input-shape", "6", "--memory-limit", "lots"], "--memory-limit='lots'"),
        (["--input-shape", "6", "--max-batch-size", "0"], "positive int"),
        (["--input-shape", "6", "--mode", "fast"], "invalid choice"),
    ],
)
def test_find_batch_rejects_bad_arguments(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["find-batch", str(tmp_path / "m.keras"), *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_find_batch_unreadable_model(tmp_path, capsys):
    assert (
        cli.main(["find-batch", str(tmp_path / "nope.keras"), "--input-shape", "6"])
        == 2
    )
    assert "cannot load" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, remeasure", [("--remeasure", True), ("--force", True), (None, False)]
)
def test_find_batch_remeasure_and_its_old_name(
    tmp_path, capsys, monkeypatch, flag, remeasure
):
    """One name for measuring again, as in fit (`--force` kept as its old name)."""
    from kerascale import find_batch

    path = tmp_path / "m.keras"
    _save_dense(path)
    seen = {}

    def fake(model, x, y, **kwargs):
        seen.update(kwargs)
        raise kerascale.ConfigurationError("stop here")

    monkeypatch.setattr(find_batch, "find_batch_size", fake)
    argv = ["find-batch", str(path), "--input-shape", "6", *([flag] if flag else [])]
    assert cli.main(argv) == 1
    assert seen["remeasure"] is remeasure and "force" not in seen


def test_every_flag_says_what_it_does():
    """`--help` documents each flag of each command (issue 41)."""
    import argparse

    parser = cli.build_parser()
    commands = [parser]
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            commands += list(action.choices.values())
    silent = [
        f"{command.prog} {'/'.join(a.option_strings) or a.dest}"
        for command in commands
        for a in command._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert not silent, silent


def test_clear_cache_forgets_every_kind_it_cached(tmp_path, capsys, monkeypatch):
    """`kerascale clear-cache` says it forgets every measurement: it does, of
    every kind (issue 55: the bf16 reference step's `first_trace/` and JAX's
    sharding decisions stayed)."""
    from kerascale.measure import cache

    monkeypatch.setenv("KERASCALE_CACHE_DIR", str(tmp_path))
    kinds = ("batch_search", "trials", "first_trace", "jax-sharding-1")
    for kind in kinds:
        cache.cache_write(kind, "k", {"seconds": 1.0})
        assert cache.cache_read(kind, "k") is not None
    assert cli.main(["clear-cache"]) == 0
    assert "removed 4 cached measurement(s)" in capsys.readouterr().out
    assert all(cache.cache_read(kind, "k") is None for kind in kinds)
    # Nothing but its own kinds: the directory may be one the user shares.
    other = tmp_path / "someone_else" / "settings.json"
    other.parent.mkdir()
    other.write_text("{}")
    assert cli.main(["clear-cache"]) == 0 and other.exists()
    with pytest.raises(ValueError, match="no kind"):
        cache.cache_write("unlisted", "k", {})


def test_doctor_starts_without_tensorflow_s_cpu_banner():
    """`kerascale doctor` is the command's own process: TensorFlow's C++
    start-up banner ("This TensorFlow binary is optimized to use available
    CPU instructions") is not part of its report (issue 55), unless the user
    set TensorFlow's log level themselves."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.pop("TF_CONFIG", None)
    entry = "import sys, kerascale_cli; sys.exit(kerascale_cli.main())"
    for level, shown in ((None, False), ("0", True)):
        run_env = env if level is None else {**env, "TF_CPP_MIN_LOG_LEVEL": level}
        proc = subprocess.run(
            [sys.executable, "-c", entry, "doctor"],
            capture_output=True,
            text=True,
            timeout=120,
            env=run_env,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        banner = "optimized to use available CPU instructions" in proc.stderr
        assert banner == shown, (level, proc.stderr[-2000:])


@pytest.mark.nightly  # the doctor reports this Keras's fixes
def test_doctor_says_which_keras_and_each_fix_s_status(capsys, monkeypatch):
    """Issue 56: the Keras here, the ones the suite passed on, and whether
    each Keras fix is active, not needed or unknown (text and JSON)."""
    import keras

    from kerascale._keras_compat import epoch_order, status

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["keras"]
    assert report["version"] == keras.__version__
    assert report["tested"] == list(status.TESTED) and not report["newer"]
    by_name = {f["fix"]: f for f in report["fixes"]}
    assert set(by_name) == {
        "resume in the saved data order",
        "multi-worker fit",
        "accumulation under tf.distribute",
    }
    order = by_name["resume in the saved data order"]
    # Keras 3.16 seeds its shuffle from the adapter's counter; 3.15 does not.
    counted = status._adapter_counter() is not None
    assert order["status"] == ("active" if counted else "not needed"), order
    assert {f["status"] for f in report["fixes"]} <= {"active", "not needed"}
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"keras:    {keras.__version__}; the suite last passed on" in out
    assert f"resume in the saved data order ({epoch_order.UPSTREAM}): " in out
    # Upstream changed in a way not seen: said, not hidden.
    monkeypatch.setattr(
        epoch_order, "keras_fit_holds_the_epoch_iterator", lambda: False
    )
    assert status.fixes(tf_distribute=False)[0]["status"] == "unknown"


@pytest.mark.nightly  # the doctor reports this Keras's fixes
def test_a_keras_newer_than_any_tested_is_told_apart():
    from kerascale._keras_compat import status

    assert status.newer_than_tested("3.17.0")
    assert status.newer_than_tested("3.16.0")  # the release after its dev build
    assert not status.newer_than_tested("3.16.0.dev2026102704")
    assert not status.newer_than_tested("3.15.1")
