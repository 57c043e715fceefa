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
        kerascale.fit, kerascale.plan, kerascale.find_batch_size,
        kerascale.diagnose, kerascale.accumulate, callbacks.FaultTolerantBackup,
        callbacks.Throughput, callbacks.GPUMonitor, callbacks.TimeBudget,
        callbacks.ProfileWindow, tuner.ScaledHyperModel, data.optimize,
        data.materialize,
    )  # fmt: skip
    named = {}
    for path in PACKAGE.rglob("*.py"):
        for text in texts(path):
            for after in PASS.split(text)[1:]:
                for name in ARGUMENT.findall(after[:80]):
                    named.setdefault(name, path.relative_to(PACKAGE))
    assert {"batch_size", "max_batch_size", "isolate"} <= set(named)  # read
    unknown = {n: str(p) for n, p in named.items() if n not in doors | KERAS_FIT}
    assert set(unknown) <= THEIRS, unknown
