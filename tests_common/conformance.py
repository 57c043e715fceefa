"""kerascale's promises, each stated once as a check that runs on any cell
of the matrix: backend (TensorFlow; JAX with TensorFlow; JAX without it) x
devices (1, 2) x input kind x precision.

Every check builds its data and model afresh from a seed, as a script that
is run again would, and interrupts in-process (an exception raised from a
callback, as Keras's own `BackupAndRestore` tests do), so a cell costs a few
small `fit` calls. Imports nothing of TensorFlow unless a cell's input is a
`tf.data` pipeline, so the JAX suite without TensorFlow runs it too.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import warnings

import keras
import numpy as np

SAMPLES = 96
BATCH = 16  # 6 steps an epoch
EPOCHS = 3
FEATURES = 6
STEPS = SAMPLES // BATCH

INPUTS = (
    "arrays",
    "arrays_shuffled",
    "tfdata",
    "tfdata_shuffled",
    "tfdata_repeated",
    "pydataset",
    "generator",
    "grain",
)
PRECISIONS = ("float32", "mixed_bfloat16")
BACKENDS = ("tensorflow", "jax_with_tf", "jax")
DEVICES = (1, 2)
PROMISES = (
    "trains_like_fit",
    "continue_finished_run",
    "interrupt_and_rerun",
    "sigterm_saves_and_exits",
    "accumulation_equals_large_batch",
    "time_budget_stops_with_checkpoint",
    "diagnose_gives_a_verdict",
)

# How close two runs' weights must be: exact where nothing differs but the
# interruption; float noise where kerascale changes the arithmetic's order
# (several devices, micro-batches); bf16's rounding where precision differs.
EXACT = 1e-6


@dataclasses.dataclass(frozen=True)
class Cell:
    backend: str
    devices: int
    input: str
    precision: str
    promise: str

    @property
    def id(self) -> str:
        return (
            f"{self.promise}-{self.backend}-{self.devices}dev-{self.input}-"
            f"{self.precision}"
        )


def possible(backend: str, input_kind: str) -> bool:
    """Whether the cell exists: `tf.data` needs TensorFlow."""
    return not (backend == "jax" and input_kind.startswith("tfdata"))


def all_cells() -> list[Cell]:
    return [
        Cell(*values)
        for values in itertools.product(BACKENDS, DEVICES, INPUTS, PRECISIONS, PROMISES)
        if possible(values[0], values[2])
    ]


def pairwise_cells() -> list[Cell]:
    """A small set of cells in which every pair of values of two dimensions
    appears at least once (a greedy all-pairs cover, deterministic)."""
    dims = [BACKENDS, DEVICES, INPUTS, PRECISIONS, PROMISES]
    candidates = [c for c in itertools.product(*dims) if possible(c[0], c[2])]
    pairs = set()
    for c in candidates:
        for i, j in itertools.combinations(range(len(dims)), 2):
            pairs.add((i, c[i], j, c[j]))
    chosen = []
    while pairs:
        best = max(
            candidates,
            key=lambda c: sum(
                (i, c[i], j, c[j]) in pairs
                for i, j in itertools.combinations(range(len(dims)), 2)
            ),
        )
        covered = {
            (i, best[i], j, best[j])
            for i, j in itertools.combinations(range(len(dims)), 2)
        }
        pairs -= covered
        chosen.append(Cell(*best))
        candidates.remove(best)
    return chosen


# Cells that each failed once (kerascale issue 38 and what the matrix found
# next to it): CI runs them beside the pairwise cover.
REGRESSIONS = (
    # Continuing a finished run of arrays on TensorFlow trained one step per
    # remaining epoch (the used-up iterator's position was restored).
    Cell("tensorflow", 1, "arrays_shuffled", "float32", "continue_finished_run"),
    # A JAX rerun made fewer tf.data iterators than the interrupted run, so
    # its shuffle drew other seeds.
    Cell("jax_with_tf", 1, "tfdata_shuffled", "float32", "interrupt_and_rerun"),
    # A re-batched dataset lost its length, so Keras made one iterator fewer
    # per epoch and shuffled the epochs after the first unlike plain fit.
    Cell(
        "tensorflow", 1, "tfdata_shuffled", "float32", "accumulation_equals_large_batch"
    ),
    # A PyDataset reshuffled in on_epoch_end resumed with a fresh order.
    Cell("tensorflow", 1, "pydataset", "float32", "interrupt_and_rerun"),
    Cell("jax", 1, "pydataset", "float32", "sigterm_saves_and_exits"),
    # A PyDataset's batches were "split" by accumulation they never got:
    # each update saw twice the batch asked for.
    Cell("jax", 1, "pydataset", "float32", "accumulation_equals_large_batch"),
)


def covered_cells() -> list[Cell]:
    """What CI runs: the pairwise cover and the regressions."""
    cells = pairwise_cells()
    return cells + [c for c in REGRESSIONS if c not in cells]


def this_backend() -> str:
    """This process's cell of the backend dimension."""
    if keras.backend.backend() == "tensorflow":
        return "tensorflow"
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return "jax"
    return "jax_with_tf"


def this_devices() -> int:
    if keras.backend.backend() == "jax":
        import jax

        return len(jax.local_devices())
    import tensorflow as tf

    return len(tf.config.list_logical_devices("CPU"))


# --- data and model, made afresh as a rerun script makes them ---------------


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES, 1)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(SAMPLES, 1))).astype("float32")
    return x, y


class _Batches(keras.utils.PyDataset):
    """A PyDataset of the arrays in batches, reshuffled each epoch from
    NumPy's global random (as users write one)."""

    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch
        self.order = np.arange(len(x))

    def __len__(self):
        return len(self.x) // self.batch

    def __getitem__(self, i):
        idx = self.order[i * self.batch : (i + 1) * self.batch]
        return self.x[idx], self.y[idx]

    def on_epoch_end(self):
        self.order = np.random.permutation(len(self.x))


def make_input(kind: str, batch: int = BATCH):
    """(x, y, fit_kwargs) for `kind`, built afresh."""
    x, y = _arrays()
    if kind == "arrays":
        return x, y, {"batch_size": batch, "shuffle": False}
    if kind == "arrays_shuffled":
        return x, y, {"batch_size": batch}
    if kind.startswith("tfdata"):
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((x, y))
        if kind != "tfdata":
            ds = ds.shuffle(SAMPLES, seed=5)
        ds = ds.batch(batch)
        if kind == "tfdata_repeated":
            return ds.repeat(), None, {"steps_per_epoch": SAMPLES // batch}
        return ds, None, {}
    if kind == "pydataset":
        return _Batches(x, y, batch), None, {}
    if kind == "generator":

        def batches():
            i = 0
            while True:
                s = slice(i * batch % SAMPLES, i * batch % SAMPLES + batch)
                yield x[s], y[s]
                i += 1

        return batches(), None, {"steps_per_epoch": SAMPLES // batch}
    if kind == "grain":
        import grain

        ds = grain.MapDataset.source(list(zip(x, y, strict=True)))
        ds = ds.shuffle(seed=7).batch(batch, drop_remainder=True)
        return ds, None, {}
    raise ValueError(kind)


def make_model(precision: str = "float32", plain: bool = False):
    """A small model with Dropout (the random state matters), built the
    same way each call. `plain`: as a user of plain `model.fit` builds it for
    `precision` (under the global policy)."""
    keras.utils.set_random_seed(3)
    if plain:
        keras.config.set_dtype_policy(precision)
    try:
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dropout(0.25),
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def weights(model) -> list[np.ndarray]:
    return [np.asarray(w, dtype=np.float64) for w in model.get_weights()]


def distance(a, b) -> float:
    assert len(a) == len(b)
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True))


def tolerance(cell: Cell, *, same_arithmetic: bool) -> float:
    """How far two runs may end apart. `same_arithmetic`: both runs are
    kerascale's, under one plan (an interruption is all that differs)."""
    if same_arithmetic:
        return EXACT
    if cell.precision == "mixed_bfloat16":
        return 5e-2
    return 1e-4 if cell.devices > 1 else 1e-5


# --- the promises -----------------------------------------------------------


class Interrupt(Exception):
    """Stands for a kill: raised from a callback after a step."""


class _RaiseAt(keras.callbacks.Callback):
    """Acts once, after the call that ran step `step` (counted from 1 over
    the run): Keras's hooks get a call's first step and its last, and a call
    runs several where steps_per_execution is above 1."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen, self.first, self.done = step, 0, 0, False

    def on_train_batch_begin(self, batch, logs=None):
        self.first = batch

    def on_train_batch_end(self, batch, logs=None):
        # Keras gives a short last call of an epoch the end a whole call
        # would have: the epoch's length bounds it.
        steps = (self.params or {}).get("steps")
        last = min(batch, steps - 1) if steps else batch
        self.seen += last - self.first + 1
        if self.seen >= self.step and not self.done:
            self.done = True
            self.act()

    def act(self):
        raise Interrupt(self.step)


class _SigtermAt(_RaiseAt):
    def act(self):
        os.kill(os.getpid(), signal.SIGTERM)


def steps_asked(kwargs: dict, kind: str = "") -> dict:
    """`kerascale.fit`'s steps_per_execution for every cell where the
    matrix runs at several steps a call (`KERASCALE_CONFORMANCE_STEPS=N`:
    an epoch's 6 steps then run in calls of N and what is left), else
    none: "auto", which these short runs keep at 1. With `steps_per_epoch`
    (an iterator that runs on across epochs) the largest divisor of it up
    to N, as kerascale chooses there: Keras runs a call whole past such an
    epoch's end (and kerascale warns where you ask for that)."""
    n = int(os.environ.get("KERASCALE_CONFORMANCE_STEPS") or 0)
    if not n or kind == "grain":
        # Keras does not know a grain loader's epoch length: kerascale never
        # chooses more than one a call there, and Keras's own TensorFlow fit
        # trains another number of steps at 4 than at 1 (21 and 18 over 3
        # epochs of 6).
        return {}
    steps = kwargs.get("steps_per_epoch")
    if steps:
        n = max(d for d in range(1, n + 1) if steps % d == 0)
    return {"steps_per_execution": n}


def _ks_fit(
    cell: Cell, directory=None, *, epochs=EPOCHS, callbacks=(), dropout=None, **extra
):
    """`kerascale.fit` on the cell's input and precision, afresh."""
    import kerascale

    model = make_model()
    if dropout is not None:
        model.layers[1].rate = dropout
    x, y, kwargs = make_input(cell.input)
    kwargs.update(steps_asked(kwargs, cell.input))
    kwargs.update(extra)
    if cell.backend == "tensorflow" and cell.devices > 1:
        # Logical CPUs stand in for GPUs, which kerascale would mirror over.
        kwargs.setdefault("strategy", "mirrored")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            history = kerascale.fit(
                model,
                x,
                y,
                epochs=epochs,
                precision=cell.precision,
                checkpoint_dir=None if directory is None else str(directory),
                verbose=0,
                callbacks=list(callbacks),
                **kwargs,
            )
        finally:
            _SAID.extend(str(w.message) for w in caught)
    return model, history


# What kerascale said in the cell's runs (a promise it cannot keep is said).
_SAID: list[str] = []
ORDER_MAY_DIFFER = "the data order after a resume may differ"


def _resumed_like(cell, model, history, ref, steps) -> str:
    """The rerun ended as the uninterrupted run: same steps, whole History,
    the same weights; or, where kerascale said the data order may differ
    (once), the same steps and History."""
    assert int(model.optimizer.iterations) == steps
    _history_is_whole(history)
    d = distance(weights(model), ref)
    if d <= tolerance(cell, same_arithmetic=True):
        return "ok"
    said = [w for w in _SAID if ORDER_MAY_DIFFER in w]
    assert said, f"{d} from uninterrupted, and nothing said"
    assert len(set(said)) == 1, said
    why = said[0].split(ORDER_MAY_DIFFER)[-1].split(": ", 1)[-1]
    return f"dropped (one warning): order may differ: {why[:100]}"


def _reference(cell: Cell, cache: dict | None):
    """An uninterrupted `kerascale.fit` of the cell (cached per session)."""
    key = (cell.input, cell.precision)
    if cache is not None and key in cache:
        return cache[key]
    model, history = _ks_fit(cell)
    result = (weights(model), int(model.optimizer.iterations), dict(history.history))
    if cache is not None:
        cache[key] = result
    return result


def check(cell: Cell, tmp_path, cache: dict | None = None) -> str:
    """Runs the cell's promise; returns "ok" or what was dropped (a warning
    kerascale gave instead of keeping it). Fails with AssertionError."""
    _SAID.clear()
    return _CHECKS[cell.promise](cell, tmp_path, cache)


def _plain_scope(cell):
    """Where a competent user of plain `fit` builds the model: on
    TensorFlow with several devices (GPUs), under `MirroredStrategy`, whose
    replicas draw their own Dropout masks; elsewhere anywhere (JAX's
    `DataParallel` draws the global batch's masks as one device does)."""
    import contextlib

    if cell.backend == "tensorflow" and cell.devices > 1:
        import tensorflow as tf

        return tf.distribute.MirroredStrategy().scope()
    return contextlib.nullcontext()


def _plain_input(cell, batch: int = BATCH):
    """The input plain `fit` trains on in the cell: the cell's own, except a
    generator under `MirroredStrategy`. There Keras's `fit` skips a racy
    number of a generator's first batches (an iterator it reads to build the
    model, then drops: keras_compat section 7), so two plain runs differ;
    kerascale skips none. Its reference is plain `fit` on the same batches,
    in the same order, as a repeated `tf.data` pipeline."""
    if cell.input == "generator" and cell.backend == "tensorflow" and cell.devices > 1:
        x, y, _ = make_input("tfdata", batch)
        return x.repeat(), y, {"steps_per_epoch": SAMPLES // batch}
    return make_input(cell.input, batch)


def _trains_like_fit(cell, tmp_path, cache):
    # MirroredStrategy's replicas draw Dropout's masks per replica, from
    # generators kerascale's copy of the model and a model built in the
    # scope hold apart: compared without Dropout there.
    masks = not (cell.backend == "tensorflow" and cell.devices > 1)
    with _plain_scope(cell):
        model = make_model(cell.precision, plain=True)
    model.layers[1].rate = model.layers[1].rate if masks else 0.0
    x, y, kwargs = _plain_input(cell)
    model.fit(x, y, epochs=EPOCHS, verbose=0, **kwargs)
    plain = weights(model)
    if masks:
        ours, _, _ = _reference(cell, cache)
    else:
        ours = weights(_ks_fit(cell, dropout=0.0)[0])
    d = distance(plain, ours)
    assert d <= tolerance(cell, same_arithmetic=False), f"{d} from model.fit"
    return "ok"


def _history_is_whole(history, epochs=EPOCHS):
    assert history.epoch == list(range(epochs)), history.epoch
    for key, values in history.history.items():
        assert len(values) == epochs, (key, values)


def _continue_finished_run(cell, tmp_path, cache):
    ref, steps, _ = _reference(cell, cache)
    _ks_fit(cell, tmp_path / "ckpt", epochs=1)
    model, history = _ks_fit(cell, tmp_path / "ckpt")
    return _resumed_like(cell, model, history, ref, steps)


def _interrupt_and_rerun(cell, tmp_path, cache):
    ref, steps, _ = _reference(cell, cache)
    at = STEPS + STEPS // 2 + 1  # mid-epoch 2, after a save at step STEPS + 2
    try:
        _ks_fit(
            cell,
            tmp_path / "ckpt",
            callbacks=[_RaiseAt(at)],
            checkpoint_freq=2,
        )
    except Interrupt:
        pass
    else:
        raise AssertionError("the interruption did not happen")
    model, history = _ks_fit(cell, tmp_path / "ckpt", checkpoint_freq=2)
    return _resumed_like(cell, model, history, ref, steps)


def _sigterm_saves_and_exits(cell, tmp_path, cache):
    ref, steps, _ = _reference(cell, cache)
    at = STEPS + 2
    # The script's own handler, which kerascale calls after its save (the
    # default one would end this process, a test runner's worker).
    called = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: called.append(1))
    try:
        _ks_fit(cell, tmp_path / "ckpt", callbacks=[_SigtermAt(at)])
    except SystemExit as e:
        assert e.code == 143, e.code
    else:
        raise AssertionError("SIGTERM did not end the run with exit code 143")
    finally:
        signal.signal(signal.SIGTERM, before)
    assert called == [1], "the script's own SIGTERM handler was not called"
    model, history = _ks_fit(cell, tmp_path / "ckpt")
    return _resumed_like(cell, model, history, ref, steps)


def _accumulation_equals_large_batch(cell, tmp_path, cache):
    """A batch of 32 reached as 2 micro-batches of 16 trains as plain fit's
    batch of 32 (Dropout off: the micro-batches draw their masks apart)."""
    import kerascale

    def model_without_dropout(plain):
        model = make_model(cell.precision, plain=plain)
        model.layers[1].rate = 0.0
        return model

    with _plain_scope(cell):
        model = model_without_dropout(plain=True)
    x, y, kwargs = _plain_input(cell, batch=32)
    model.fit(x, y, epochs=EPOCHS, verbose=0, **kwargs)
    plain = weights(model)
    model = model_without_dropout(plain=False)
    x, y, kwargs = make_input(cell.input, batch=32)
    kwargs["batch_size"] = 32
    kwargs.update(steps_asked(kwargs, cell.input))
    if cell.backend == "tensorflow" and cell.devices > 1:
        kwargs["strategy"] = "mirrored"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kerascale.fit(
            model,
            x,
            y,
            epochs=EPOCHS,
            precision=cell.precision,
            max_batch_size=16,
            verbose=0,
            **kwargs,
        )
    plan = history.plan
    d = distance(weights(model), plain)
    tol = tolerance(cell, same_arithmetic=False)
    # Dropped or not, what trained is what plain fit trains at 32.
    assert d <= max(tol, 1e-4), f"{d} from plain fit at batch 32"
    if plan.accumulation_steps == 1:
        dropped = [
            str(w.message)
            for w in caught
            if str(w.message).startswith("Gradient accumulation skipped")
        ]
        assert len(dropped) == 1, [str(w.message) for w in caught]
        return "dropped (one warning): kerascale cannot cut batches this input makes"
    assert plan.accumulation_steps == 2 and plan.global_batch_size == 32, plan
    return "ok"


def _time_budget_stops_with_checkpoint(cell, tmp_path, cache):
    """A budget that ends mid-run stops at a step boundary with a checkpoint
    that a rerun continues to the uninterrupted result."""
    from kerascale.callbacks import checkpoint_store as store

    ref, steps, _ = _reference(cell, cache)
    model, _ = _ks_fit(cell, tmp_path / "ckpt", time_budget=1e-9)
    found = store.scan(str(tmp_path / "ckpt"))
    assert found, "no checkpoint after the budget ran out"
    assert int(model.optimizer.iterations) < steps
    model, history = _ks_fit(cell, tmp_path / "ckpt")
    return _resumed_like(cell, model, history, ref, steps)


def _diagnose_gives_a_verdict(cell, tmp_path, cache):
    """A verdict for every input `fit` takes that can be read more than once
    (a grain `MapDataset` too); for one that cannot (a generator), an error
    that names `x` and says why, before anything is read."""
    import kerascale

    model = make_model()
    x, y, kwargs = make_input(cell.input)
    try:
        found = kerascale.diagnose(
            model,
            x,
            y,
            steps=3,
            precision=cell.precision,
            verbose=0,
            batch_size=kwargs.get("batch_size", "auto"),
        )
    except kerascale.ConfigurationError as e:
        assert cell.input == "generator", e
        assert str(e).startswith("x must be") and "read" in str(e), e
        return "dropped (an error before reading): diagnose reads x several times"
    assert found.bound in ("input", "compute", "memory"), found
    return "ok"


_CHECKS = {
    "trains_like_fit": _trains_like_fit,
    "continue_finished_run": _continue_finished_run,
    "interrupt_and_rerun": _interrupt_and_rerun,
    "sigterm_saves_and_exits": _sigterm_saves_and_exits,
    "accumulation_equals_large_batch": _accumulation_equals_large_batch,
    "time_budget_stops_with_checkpoint": _time_budget_stops_with_checkpoint,
    "diagnose_gives_a_verdict": _diagnose_gives_a_verdict,
}


def setup_devices() -> None:
    """This process's devices, from ``KERASCALE_TEST_DEVICES`` (default 1):
    JAX's forced host devices or TensorFlow's logical CPUs. Call before the
    backend runs anything."""
    n = int(os.environ.get("KERASCALE_TEST_DEVICES", "1"))
    if keras.backend.backend() == "jax":
        import jax

        if len(jax.local_devices()) != n:
            raise RuntimeError(
                f"JAX has {len(jax.local_devices())} devices, not {n}: set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={n}"
            )
        if n > 1:  # they stand in for GPUs: "auto" splits over them
            os.environ["KERASCALE_CPU_DEVICES_STAND_IN"] = "1"
        return
    import tensorflow as tf

    if n > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n
        )


def fresh_session() -> None:
    """What the suites do between tests: a clean Keras session."""
    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    if keras.backend.backend() == "jax":
        keras.distribution.set_distribution(None)


# --- running cells, as the suites and the full-matrix script do --------------


def run_cells(cells: list[Cell], echo: bool = True) -> list[tuple[Cell, str, float]]:
    """Runs each cell in this process; returns (cell, result, seconds),
    the result "ok", "dropped ...", or "FAIL ...". Prints markdown rows."""
    import tempfile
    import time
    import traceback
    from pathlib import Path

    cache: dict = {}
    rows = []
    if echo:
        print("| promise | backend | devices | input | precision | result | s |")
        print("|---|---|---|---|---|---|---|", flush=True)
    for cell in cells:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            fresh_session()
            try:
                result = check(cell, Path(tmp), cache)
            except Exception as e:
                last = traceback.extract_tb(e.__traceback__)[-1]
                result = (
                    f"FAIL {type(e).__name__}: {str(e)[:300]!r} "
                    f"({Path(last.filename).name}:{last.lineno})"
                )
        took = time.perf_counter() - started
        rows.append((cell, result, took))
        if echo:
            print(
                f"| {cell.promise} | {cell.backend} | {cell.devices} | {cell.input} "
                f"| {cell.precision} | {result} | {took:.1f} |",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Runs the cells this process can run (its backend and device count):
    every one, or CI's (``--pairwise``: the pairwise cover and the
    regressions), as a markdown table.

        KERAS_BACKEND=jax KERASCALE_TEST_DEVICES=2 \\
        XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        python tests_common/conformance.py [--pairwise] [--promise P] [--input I]
    """
    import argparse

    p = argparse.ArgumentParser(description="kerascale's conformance matrix")
    p.add_argument("--promise", action="append")
    p.add_argument("--input", action="append")
    p.add_argument("--precision", action="append")
    p.add_argument("--pairwise", action="store_true")
    args = p.parse_args(argv)
    setup_devices()
    backend, devices = this_backend(), this_devices()
    cells = [
        cell
        for cell in (covered_cells() if args.pairwise else all_cells())
        if cell.backend == backend
        and cell.devices == devices
        and (not args.promise or cell.promise in args.promise)
        and (not args.input or cell.input in args.input)
        and (not args.precision or cell.precision in args.precision)
    ]
    rows = run_cells(cells)
    return 1 if any(r.startswith("FAIL") for _, r, _ in rows) else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
