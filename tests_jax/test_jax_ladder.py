"""The decision's one ladder, on JAX (issue 57): `decide` is entered once
per attempt, only from the door's loop (`plan.fallback.attempted`), and each
measurement stage runs at most once in an entry (tests_common/attempts.py).
A plain fit's single entry: test_jax_fit.py's first test. Rungs taken on
JAX: test_compiled_search.py's searched batch that runs out of memory at the
first step, and test_jax_fit.py's model that cannot be laid out (2 devices)."""

import attempts as attempts_lib
from conftest import dense_model, toy_data

import kerascale


def test_plan_and_find_batch_size_decide_once(monkeypatch):
    model = dense_model()
    x, y = toy_data(n=1024)
    attempts = attempts_lib.record(monkeypatch)
    kerascale.plan(model, x, y, verbose=0)
    kerascale.find_batch_size(
        model, x, y, device_memory="64MiB", max_batch_size=128, verbose=0
    )
    attempts.check(2)
