"""Every argument a plan's reason tells the user to pass is one the doors
that print plans take (issue 55: a hint named `start_over=True`, which only
`FaultTolerantBackup` took, and `kerascale.fit` handed it to Keras, which
raised). Read from the source of the reasons' table with `ast`; the hints
the issue named are followed for real in their own tests
(test_backup.py, test_planning.py, tests_jax/test_jax_fit.py)."""

import ast
import inspect
import pathlib
import re

import keras

import kerascale

REASONS = pathlib.Path(kerascale.__file__).parent / "plan" / "reasons.py"
# `name=value` in a sentence: an argument to pass (not `x=...` in code).
ARGUMENT = re.compile(r"(?<![\w.])([a-z][a-z_]*)=(?=['\"0-9A-Za-z({<\s]|$)")


def named_arguments(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= set(ARGUMENT.findall(node.value))
    return names


def parameters(*functions):
    return {name for f in functions for name in inspect.signature(f).parameters}


def test_every_argument_a_reason_names_is_one_its_door_takes():
    doors = parameters(kerascale.fit, kerascale.find_batch_size)
    keras_fit = parameters(keras.Model.fit)  # passed through by kerascale.fit
    named = named_arguments(REASONS)
    assert {"batch_size", "precision", "recompute", "strategy"} <= named  # read
    assert named <= doors | keras_fit, sorted(named - doors - keras_fit)
