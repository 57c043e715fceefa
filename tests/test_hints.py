"""Every argument kerascale's words tell the user to pass is one the doors
take (issue 55: a hint named `start_over=True`, which only
`FaultTolerantBackup` took, and `kerascale.fit` handed it to Keras, which
raised). Read from the source with `ast`: the plan's reasons against the
doors that print plans, and every "pass name=..." anywhere against every
public door. The hints the issue named are followed for real in their own
tests (test_backup.py, test_planning.py, test_batch_search.py,
tests_jax/test_jax_fit.py)."""

import ast
import inspect
import pathlib
import re
from unittest import mock

import keras

import kerascale
from kerascale import callbacks, data, tuner

PACKAGE = pathlib.Path(kerascale.__file__).parent
# `name=value` in a sentence: an argument to pass (not `x=...` in code).
ARGUMENT = re.compile(r"(?<![\w.])([a-z][a-z_]*)=(?=['\"0-9A-Za-z({<\s]|$)")
PASS = re.compile(r"\b[Pp]ass(?:es|ing)?\b")
# Arguments of other libraries' calls a hint shows in full: tf.data's
# `shuffle(..., seed=N)`.
THEIRS = {"seed"}


def texts(path):
    """The words of each string in `path`, f-strings' literal parts joined."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def parameters(*functions):
    return {name for f in functions for name in inspect.signature(f).parameters}


KERAS_FIT = parameters(keras.Model.fit, keras.Model.compile)  # passed through


def test_every_argument_a_reason_names_is_one_its_door_takes():
    doors = parameters(kerascale.fit, kerascale.find_batch_size)
    named = {
        name
        for text in texts(PACKAGE / "plan" / "reasons.py")
        for name in ARGUMENT.findall(text)
    }
    assert {"batch_size", "precision", "recompute", "strategy"} <= named  # read
    assert named <= doors | KERAS_FIT, sorted(named - doors - KERAS_FIT)


def test_every_argument_a_hint_says_to_pass_is_one_a_door_takes():
    doors = parameters(
        kerascale.fit,
        kerascale.plan,
        kerascale.find_batch_size,
        kerascale.diagnose,
        kerascale.accumulate,
        callbacks.FaultTolerantBackup,
        callbacks.Throughput,
        callbacks.GPUMonitor,
        callbacks.TimeBudget,
        callbacks.ProfileWindow,
        tuner.ScaledHyperModel,
        data.optimize,
        data.materialize,
    )
    named = {}
    for path in PACKAGE.rglob("*.py"):
        for text in texts(path):
            for after in PASS.split(text)[1:]:
                for name in ARGUMENT.findall(after[:80]):
                    named.setdefault(name, path.relative_to(PACKAGE))
    assert {"batch_size", "max_batch_size", "isolate"} <= set(named)  # read
    unknown = {n: str(p) for n, p in named.items() if n not in doors | KERAS_FIT}
    assert set(unknown) <= THEIRS, unknown


# `name=value` with a literal value a user can copy: quoted words, numbers,
# True/False/None.
PAIR = re.compile(
    r"(?<![\w.])([a-z][a-z_]*)=('[^'{}]*'|\"[^\"{}]*\"|-?[0-9.]+\b|True|False|None)"
)


def _pairs():
    """Every literal `name=value` that a hint tells the user to pass, and
    every one the plan's reasons show, with the module that says it."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for text in texts(path):
            # The reasons show whole settings; elsewhere, what follows "pass".
            if path.name == "reasons.py":
                chunks = [text]
            else:
                chunks = [after[:80] for after in PASS.split(text)[1:]]
            for chunk in chunks:
                for name, value in PAIR.findall(chunk):
                    found.setdefault((name, ast.literal_eval(value)), path.name)
    return found


def _accepted_by_a_door(name, value):
    """Whether a door that takes `name` accepts `value`, by the door's own
    validation (what runs first in `fit`, `plan` and `find_batch_size`)."""
    from kerascale import find_batch
    from kerascale.errors import ConfigurationError
    from kerascale.fit import _Request
    from kerascale.plan import strategy as strategy_rules
    from kerascale.plan.strategy import jax as jax_rules
    from kerascale.plan.strategy import tensorflow as tf_rules

    fit_defaults = {
        k: p.default
        for k, p in inspect.signature(kerascale.fit).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    find_defaults = {
        k: p.default
        for k, p in inspect.signature(kerascale.find_batch_size).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    doors = []
    if name in fit_defaults:
        doors.append(lambda: _Request.validate(**{**fit_defaults, name: value}))
    if name in find_defaults:
        doors.append(lambda: find_batch._validated(**{**find_defaults, name: value}))
    errors = []
    # A strategy's names are its backend's: each backend's rules in turn.
    for rules in (jax_rules, tf_rules):
        for door in doors:
            with mock.patch.object(
                strategy_rules, "validate_request", rules.validate_request
            ):
                try:
                    door()
                    return True, ""
                except ConfigurationError as e:
                    errors.append(str(e))
    return False, " | ".join(errors) or "no door takes it"


def test_every_value_a_hint_shows_is_accepted_by_the_door_that_takes_it():
    pairs = _pairs()
    ours = {
        (n, v): p for (n, v), p in pairs.items() if n not in KERAS_FIT - {"batch_size"}
    }
    read = {
        ("recompute", True),
        ("recompute", False),
        ("strategy", "default"),
        ("mode", "throughput"),
        ("precision", "float32"),
        ("lr_scaling", "linear"),
    }
    assert read <= set(ours), sorted(read - set(ours))
    refused = {}
    for (name, value), where in ours.items():
        if name in THEIRS:
            continue
        ok, why = _accepted_by_a_door(name, value)
        if not ok:
            refused[f"{name}={value!r} ({where})"] = why
    assert not refused, refused
