"""A pytest plugin that routes every `model.fit` to `kerascale.fit`.

Loaded by `benchmarks/upstream_fit.py` (`-p upstream_route`) into a run of
Keras's own test files: each `fit` a test calls on a model (or on a layer
with Keras's Trainer mixed in) goes through `kerascale.fit(model, ...)`
with the same arguments, Keras's positional ones named. The `fit` calls
kerascale makes itself (the real run, probes, trials) reach Keras's own.

`KERASCALE_ROUTE_OPTIONS` (JSON) adds kerascale options to every call, e.g.
'{"precision": "float32"}'. `KERASCALE_ROUTE=0` only records: with
`KERASCALE_ROUTE_LOG` set, the ids of the tests that called `fit` are
written there as JSON, routed or not.
"""

from __future__ import annotations

import inspect
import json
import os
import threading

import keras

_inside = threading.local()
_called: set[str] = set()  # tests that called fit
_current = {"test": ""}


def _trainer_classes() -> list[type]:
    from keras.src.trainers import trainer

    # The base class: Trainer up to Keras 3.15, BaseTrainer from 3.16.
    base = getattr(trainer, "BaseTrainer", None) or trainer.Trainer
    found, todo = [], [base]
    while todo:
        cls = todo.pop()
        if "fit" in vars(cls):
            found.append(cls)
        todo += cls.__subclasses__()
    return found


def _route(original):
    names = list(inspect.signature(original).parameters)[1:]  # after self

    def fit(self, *args, **kwargs):
        _called.add(_current["test"])
        routing = os.environ.get("KERASCALE_ROUTE", "1") != "0"
        if getattr(_inside, "active", False) or not routing:
            return original(self, *args, **kwargs)
        import kerascale

        kwargs.update(zip(names, args, strict=False))
        x, y = kwargs.pop("x", None), kwargs.pop("y", None)
        if kwargs.get("batch_size") is None:
            kwargs["batch_size"] = "auto"
        kwargs.update(json.loads(os.environ.get("KERASCALE_ROUTE_OPTIONS", "{}")))
        _inside.active = True
        try:
            return kerascale.fit(self, x, y, **kwargs)
        finally:
            _inside.active = False

    fit.__wrapped__ = original
    return fit


def pytest_runtest_setup(item):
    _current["test"] = item.nodeid


def pytest_sessionfinish(session, exitstatus):
    log = os.environ.get("KERASCALE_ROUTE_LOG")
    if log:
        with open(log, "w") as f:
            json.dump(sorted(_called - {""}), f)


def pytest_configure(config):
    keras.utils.set_random_seed(0)
    for cls in _trainer_classes():
        cls.fit = _route(vars(cls)["fit"])
