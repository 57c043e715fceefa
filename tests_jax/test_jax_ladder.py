"""The decision's one ladder, on JAX (issue 57): `decide` is entered once
per attempt, only from the door's loop (`plan.fallback.attempted`), and each
measurement stage runs at most once in an entry (tests_common/attempts.py).
A rung taken on JAX: test_compiled_search.py's searched batch that runs out
of memory at the first step."""

import attempts as attempts_lib
import numpy as np
from conftest import dense_model, toy_data

import kerascale


def test_a_plain_fit_decides_once(monkeypatch):
    model = dense_model()
    x, y = toy_data()
    attempts = attempts_lib.record(monkeypatch)
    history = kerascale.fit(model, x, y, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    attempts.check(1)


def test_plan_and_find_batch_size_decide_once(monkeypatch):
    model = dense_model()
    x, y = toy_data(n=256)
    attempts = attempts_lib.record(monkeypatch)
    kerascale.plan(model, x, y, verbose=0)
    kerascale.find_batch_size(
        model, x, y, device_memory="64MiB", max_batch_size=128, verbose=0
    )
    attempts.check(2)
