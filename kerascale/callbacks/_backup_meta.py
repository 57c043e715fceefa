"""What a checkpoint says about the run, beside its state: one `RunRecord`
a run, which `FaultTolerantBackup` asks to write the record at each save and,
at a resume, to read it for this worker, verify the configuration, restore
the state and the random state, and check the input. It owns the
configuration's fingerprint, the random state (`_run_random`), the input's
fingerprint (`_input_fingerprint`) and every worker's record; the callback
decides only when."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

import keras

from kerascale import _fs
from kerascale import _keras_compat as keras_compat
from kerascale import _validation as v
from kerascale._state import quiet_variable_reads, value_of
from kerascale.apply import batch_growth
from kerascale.apply.model import core_optimizer
from kerascale.callbacks import _backup_state as state_lib
from kerascale.callbacks import _input_fingerprint as input_print
from kerascale.callbacks._run_random import random_state, restore_random_state
from kerascale.errors import CheckpointError, warn
from kerascale.sense import backend as backend_lib
from kerascale.sense.model_facts import architecture, compiled, without_learning_rate

if TYPE_CHECKING:
    from kerascale.apply.step_agreement import Agreement
    from kerascale.plan.plan import Plan


def validate_directory(directory: Any) -> str:
    if isinstance(directory, os.PathLike):
        directory = os.fspath(directory)
    if not isinstance(directory, str) or not directory.strip():
        raise v.fail(
            "directory",
            directory,
            "a non-empty path (str or os.PathLike) to a directory",
        )
    if "://" not in directory:
        directory = os.path.abspath(os.path.expanduser(directory))
    if _fs.exists(directory) and not _fs.isdir(directory):
        raise v.fail("directory", directory, "a directory, not an existing file")
    return directory


def fingerprint(
    model: keras.Model, plan: Plan, *, start_rate: float | None = None
) -> dict[str, Any]:
    """What must not change between a checkpoint and its resume.
    `start_rate`: the learning rate the run started at (`start_rate`): the
    optimizer's rate now may be another (a `ReduceLROnPlateau` cut it, the
    batch grew) and is the checkpoint's state, restored with it."""
    optimizer = model.optimizer
    variables = [
        (tuple(x.shape), str(x.dtype)) for x in [*model.variables, *optimizer.variables]
    ]
    arch = architecture(model) or type(model).__qualname__
    with quiet_variable_reads():
        config = optimizer.get_config()
    config = _without_names(json.loads(json.dumps(config, default=str)))
    core = core_optimizer(optimizer)
    fp = {
        "architecture": hashlib.sha256(arch.encode()).hexdigest()[:16],
        "compiled": hashlib.sha256(compiled(model).encode()).hexdigest()[:16],
        "variables": hashlib.sha256(repr(variables).encode()).hexdigest()[:16],
        "optimizer": {
            "class": type(optimizer).__name__,
            "config": without_learning_rate(config),
        },
        "learning_rate": start_rate,
        "accumulation_steps": int(
            getattr(core, "gradient_accumulation_steps", None) or 1
        ),
        "precision": model.dtype_policy.name,
    }
    if plan is not None:
        fp["global_batch_size"] = plan.global_batch_size
        fp["accumulation_steps"] = plan.accumulation_steps
        fp["precision"] = plan.precision
    return fp


def start_rate(model: keras.Model) -> float | None:
    """The optimizer's learning rate as a number, read at a run's start
    (None for a schedule or a function, which its config holds)."""
    rate = keras_compat.learning_rate_object(core_optimizer(model.optimizer))
    if isinstance(rate, int | float):
        return float(rate)
    if isinstance(rate, keras.Variable):
        return float(value_of(rate))
    return None


def _without_names(config: Any) -> Any:
    """An optimizer's config without its (automatic, per-session) names."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _optimizer_change(saved: dict[str, Any], now: dict[str, Any]) -> str:
    if saved.get("class") != now.get("class"):
        return f"optimizer: {saved.get('class')} then, {now.get('class')} now"
    diffs = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            diffs.append(f"{path} {a!r} then, {b!r} now")

    walk(saved.get("config", {}), now.get("config", {}), "")
    return "optimizer settings: " + ", ".join(diffs[:4])


_WORDS = {
    "architecture": "the model's architecture",
    "compiled": "how the model is compiled (its loss, metrics or optimizer)",
    "variables": "the model's or optimizer's variables (number or shapes)",
}


def older_fingerprint(saved: dict[str, Any], now: dict[str, Any], model: Any) -> None:
    """Makes `now` comparable with `saved` where kerascale 0.1.0 before its
    "compiled" wrote it (no "compiled"): the architecture then held the compile config
    and the optimizer's config its learning rate, which a checkpoint of a
    run whose rate a callback moved then recorded as it was at the save."""
    if "compiled" in saved:
        return
    arch = architecture(model, with_compile_config=True) or type(model).__qualname__
    now["architecture"] = hashlib.sha256(arch.encode()).hexdigest()[:16]
    if isinstance(saved.get("optimizer"), dict):
        saved["optimizer"] = without_learning_rate(saved["optimizer"])


def check_fingerprint(
    saved: dict[str, Any],
    now: dict[str, Any],
    path: str,
    start_over: str = "FaultTolerantBackup(..., start_over=True)",
) -> None:
    """Raises `CheckpointError` naming what changed between the configuration
    a checkpoint was written under (`saved`) and this run's (`now`), and
    `start_over`: how the door that made the backup trains from scratch."""
    changed = []
    for key in sorted(set(saved) & set(now)):
        if saved[key] == now[key]:
            continue
        if key == "optimizer":
            changed.append(_optimizer_change(saved[key], now[key]))
        elif key in _WORDS:
            changed.append(_WORDS[key])
        elif key == "learning_rate":
            changed.append(
                f"learning_rate (the rate the run started at): {saved[key]!r} "
                f"then, {now[key]!r} now"
            )
        else:
            changed.append(f"{key}: {saved[key]!r} then, {now[key]!r} now")
    if changed:
        raise CheckpointError(
            f"The checkpoint {path} was written by a different "
            "configuration; what changed: "
            + "; ".join(dict.fromkeys(changed))
            + ". Resume with the settings it was written with, or pass "
            f"{start_over} (or use a new directory) to train from scratch."
        )


def gather_random(
    agreement: Agreement | None,
    name: str,
    meta: dict[str, Any],
    data: dict[str, Any],
) -> None:
    """With several workers, puts every worker's random state (now, and at
    its epoch's start where the data record has one) into the chief's
    `meta` as "random_by_worker": each process's own draws (a shuffle of
    its share of the arrays) differ, and a resume puts each one's back. Every
    worker calls it at the same save."""
    if agreement is None:
        return
    mine = {"now": meta["random"], "epoch": data.get("random")}
    every = agreement.gather(name, mine)
    if every is not None:
        meta["random_by_worker"] = every


def for_worker(meta: dict[str, Any], worker: int) -> dict[str, Any]:
    """`meta` as worker `worker` restores it: its own random states where
    the checkpoint holds every worker's (`gather_random`), else as written."""
    every = meta.get("random_by_worker")
    if not isinstance(every, list) or not 0 <= worker < len(every):
        return meta
    own = every[worker]
    if not isinstance(own, dict):
        return meta
    data = dict(meta.get("data") or {})
    if own.get("epoch") is not None and "random" in data:
        data["random"] = own["epoch"]
    return {**meta, "random": own.get("now", meta.get("random")), "data": data}


class StateMismatch(Exception):
    """A checkpoint's state does not agree with its metadata."""


def trackables(model: keras.Model, *, global_seed: bool | None) -> dict[str, Any]:
    """The state a checkpoint holds. Keras's global seed generator is in it
    when it exists (`global_seed=None`), or as the checkpoint being read says
    (then created if missing: its state is overwritten on reading, and so is
    the Python random state its creation draws from)."""
    if global_seed is None:
        generator = keras_compat.existing_global_seed_generator()
    else:
        generator = keras_compat.global_seed_generator() if global_seed else None
    return {
        "model": list(model.variables),
        "optimizer": list(model.optimizer.variables),
        "metrics": list(model.metrics_variables),
        "seeds": [generator.state] if generator is not None else [],
    }


def read_state(model: keras.Model, prefix: str, meta: dict[str, Any]) -> None:
    """Reads the checkpoint's state under `prefix` into `model` (all but the
    metrics and the iterator, which wait for the first step) and puts back
    the random state; raises `StateMismatch` when the state and `meta`
    disagree."""
    # Old checkpoints always hold the global seed generator.
    objects = trackables(model, global_seed=meta.get("global_seed", True))
    objects.pop("metrics")
    state_lib.read(prefix, objects, meta.get("state_format", "tf"))
    iterations = int(value_of(model.optimizer.iterations))
    if iterations != meta["iterations"]:
        raise StateMismatch(
            f"its metadata says {meta['iterations']} optimizer iterations "
            f"but the saved state holds {iterations}"
        )
    steps = meta["epoch_steps"]
    expected = meta["epoch"] * steps + meta["step"] if steps else meta["step"]
    # Where the batch grew in the run its epochs do not all have `steps`
    # steps: the iterations above are what checks the position.
    counted = not batch_growth.grown((meta.get("levers") or {}).get("batch"))
    if counted and (steps or meta["epoch"] == 0) and meta["global_step"] != expected:
        raise StateMismatch(
            f"epoch {meta['epoch']} step {meta['step']} does not agree with "
            f"{meta['global_step']} steps trained"
        )
    try:
        restore_random_state(meta["random"])
    except ValueError as e:
        raise StateMismatch(str(e)) from None


def record(
    model: keras.Model,
    plan: Plan,
    objects: dict[str, Any],
    *,
    workers: tuple[Any, str] = (None, ""),
    start_rate: float | None = None,
    **position: Any,
) -> dict[str, Any]:
    """A checkpoint's metadata: its `position` (epoch, step, global_step,
    epoch_steps, epochs, data, history), the configuration's fingerprint,
    the plan, the random state and the versions. `workers`: the run's
    agreement among several workers (None alone) and this save's name, the
    same on every worker: every worker's random state is gathered then
    (`gather_random`). `start_rate`: the learning rate the run started at
    (`fingerprint`)."""
    epoch, step = position["epoch"], position["step"]
    meta = {
        **position,
        "iterations": int(value_of(model.optimizer.iterations)),
        "finished": bool(epoch >= position["epochs"] and step == 0),
        "fingerprint": fingerprint(model, plan, start_rate=start_rate),
        "plan": plan.to_dict() if plan is not None else None,
        "random": random_state(),
        "global_seed": bool(objects["seeds"]),
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "state_format": state_lib.format_name(),
        "versions": {
            "keras": keras.__version__,
            backend_lib.name(): backend_lib.version(),
        },
    }
    gather_random(workers[0], workers[1], meta, position["data"])
    return meta


def prepend_history(model: keras.Model, before: dict[str, Any]) -> None:
    """Puts the epochs of the runs before a resume (`before`, as saved) into
    this run's `History`, so `history.history["loss"]` covers the whole
    training."""
    history = getattr(model, "history", None)
    if not isinstance(history, keras.callbacks.History) or not before["epoch"]:
        return
    history.epoch = list(before["epoch"]) + list(history.epoch)
    for key, values in before["logs"].items():
        history.history[key] = list(values) + list(history.history.get(key, []))


class RunRecord:
    """What checkpoints say about one run of `model` under `plan`, beside
    its state. `begin` reads the run at its start; `write` makes a save's
    record; a resume asks `read`, `verify`, `restore` and `check_input`.
    `start_over`: how the door that made the backup trains from scratch (its
    errors name it)."""

    def __init__(self, model: keras.Model, plan: Plan | None, start_over: str):
        self.model, self.plan, self.start_over = model, plan, start_over
        self.start_rate: float | None = None  # the rate the run started at
        self.input: dict[str, Any] | None = None  # `_input_fingerprint`'s

    def begin(self, adapter: Any) -> None:
        """At the run's start, before anything reads the input or a resume
        restores the checkpoint's learning rate: what the input is (read from
        Keras's data adapter), and the rate the run starts at."""
        self.input = input_print.of_adapter(adapter)
        self.start_rate = start_rate(self.model)

    def write(
        self, objects: dict[str, Any], *, workers: tuple[Any, str], **position: Any
    ) -> dict[str, Any]:
        """A save's record (`record`), with the input's fingerprint."""
        return record(
            self.model, self.plan, objects, workers=workers,
            start_rate=self.start_rate, input=self.input, **position,
        )  # fmt: skip

    @staticmethod
    def read(written: dict[str, Any], worker: int) -> dict[str, Any]:
        """The record as worker `worker` restores it (`for_worker`)."""
        return for_worker(written, worker)

    def verify(self, meta: dict[str, Any], path: str) -> None:
        """Raises `CheckpointError` where this run's configuration is not
        the one checkpoint `path` was written under."""
        now = fingerprint(self.model, self.plan, start_rate=self.start_rate)
        saved = dict(meta["fingerprint"])
        older_fingerprint(saved, now, self.model)
        check_fingerprint(saved, now, path, self.start_over)

    def restore(self, meta: dict[str, Any], prefix: str) -> None:
        """Reads the state under `prefix` into the model and puts back the
        random state (`read_state`); raises `StateMismatch`."""
        read_state(self.model, prefix, meta)

    def check_input(self, meta: dict[str, Any], path: str) -> bool:
        """Warns once where this run's input is not the one checkpoint `path`
        was trained on, or where it could not be checked; True where it
        differs (the last-batch check then has nothing to add)."""
        saved = meta.get("input")
        differs = input_print.difference(saved, self.input)
        if differs:
            warn(
                f"The input differs from the one checkpoint {path} was "
                f"trained on ({differs}): the resumed run trains on other "
                "data or in another order than the interrupted one. Training "
                "goes on; the weights will not match an uninterrupted run."
            )
            return True
        unchecked = input_print.unchecked_why(self.input)
        # Where the record holds the last batch trained, the resume reads it
        # again and compares it (`_input_order.check`).
        if saved and unchecked and not (meta.get("data") or {}).get("last_batch"):
            warn(
                "FaultTolerantBackup could not check that the input is the "
                f"one checkpoint {path} was trained on ({unchecked}); "
                + input_print.what_was_checked(self.input)
                + ". Training goes on."
            )
        return False
