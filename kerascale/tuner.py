"""keras-tuner integration: batch size as a memory-aware hyperparameter.

Its design: docs/design/modules.md, `kerascale.tuner`.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import keras

try:
    import keras_tuner
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "kerascale.tuner needs keras-tuner: pip install 'kerascale[tuner]'"
    ) from e

from kerascale import _validation
from kerascale.errors import BatchSizeSearchError, ConfigurationError, first_line, warn
from kerascale.plan import options as options_lib

logger = logging.getLogger("kerascale")

INFEASIBLE = "kerascale_infeasible"
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
LR_RULES = ("none", "linear", "sqrt")
# Arguments of kerascale.fit that a trial's hyperparameters set.
_FROM_HP = ("batch_size", "precision", "lr_scaling")


class ScaledHyperModel(keras_tuner.HyperModel):
    """A HyperModel that tunes the batch size within what memory holds.

    Args:
        build: A function `build(hp) -> compiled keras.Model`. Or subclass and
            override `build(self, hp)`. Defaults to `None`.
        batch_size: `(min, max)`: the batch sizes to search, per optimizer
            update (all replicas). Sampled on a log scale in steps of
            `batch_step` (powers of two from `min` by default). The largest
            batch that fits lowers `max`. Defaults to `(16, 1024)`.
        batch_step: The factor between neighbouring batch sizes. Defaults to 2.
        precision: Dtype policies to tune over, e.g. `("float32",
            "mixed_bfloat16")`. Defaults to `None`: kerascale picks (see
            `kerascale.fit`), untuned.
        lr_scaling: Learning-rate rules to tune over, among "none", "linear"
            and "sqrt" (the rate scaled by B/base or sqrt(B/base)). Needs
            `base_batch_size`. Defaults to `None`: untuned, unscaled.
        base_batch_size: The batch the build function's learning rate is set
            for, for `lr_scaling`. Defaults to `None`.
        memory_limit: Memory training must fit in, as in `kerascale.fit`
            (bytes or "6GiB"; per GPU on GPUs). Defaults to `None`.
        accumulate: Reach batches larger than memory with gradient
            accumulation instead of declaring them infeasible. Defaults to
            False.
        name: As in `keras_tuner.HyperModel`.
        tunable: As in `keras_tuner.HyperModel`.
        **fit_options: Other `kerascale.fit` options for every trial
            (strategy, optimize_data, verbose, ...).

    Attributes:
        bounds: (model configuration's fingerprint, precision) -> the largest
            batch measured to fit.
        infeasible: Trial id -> why it was infeasible.

    Example:

    >>> hypermodel = ScaledHyperModel(build_model, batch_size=(16, 512),
    ...                               precision=("float32", "mixed_bfloat16"))
    >>> tuner = keras_tuner.RandomSearch(hypermodel, objective="val_loss",
    ...                                  max_trials=8, directory="tuning")
    >>> tuner.search(x, y, epochs=2, validation_split=0.2)
    """

    def __init__(
        self,
        build: Callable[[Any], Any] | None = None,
        *,
        batch_size: Sequence[int] = (16, 1024),
        batch_step: int = 2,
        precision: Sequence[str] | None = None,
        lr_scaling: Sequence[str | None] | None = None,
        base_batch_size: int | None = None,
        memory_limit: int | str | None = None,
        accumulate: bool = False,
        name: str | None = None,
        tunable: bool = True,
        **fit_options: Any,
    ):
        super().__init__(name=name, tunable=tunable)
        if build is not None and not callable(build):
            raise _validation.fail(
                "build", build, "a function build(hp) returning a compiled model"
            )
        self._build_fn = build
        self.batch_range = _batch_range(batch_size)
        self.batch_step = _validation.positive_int("batch_step", batch_step)
        if self.batch_step < 2:
            raise _validation.fail("batch_step", batch_step, "an int >= 2")
        self.precisions = _choices("precision", precision, PRECISIONS)
        rules = None
        if lr_scaling is not None:
            rules = [
                "none" if r is None else r for r in _as_list("lr_scaling", lr_scaling)
            ]
        self.lr_rules = _choices("lr_scaling", rules, LR_RULES)
        if base_batch_size is not None:
            base_batch_size = _validation.positive_int(
                "base_batch_size", base_batch_size
            )
        if self.lr_rules and base_batch_size is None:
            raise ConfigurationError(
                "lr_scaling needs base_batch_size: the batch your learning rate is "
                f"set for. Received: lr_scaling={tuple(self.lr_rules)}, "
                "base_batch_size=None"
            )
        self.base_batch_size = base_batch_size
        self.memory_limit = memory_limit
        self.accumulate = _validation.boolean("accumulate", accumulate)
        self.fit_options = _fit_options(fit_options)
        self.bounds: dict[tuple[str, str], int] = {}
        self.infeasible: dict[str, str] = {}
        self._declared_max: int | None = None

    # --- keras-tuner's hooks -----------------------------------------------

    def build(self, hp):
        if self._build_fn is None:
            raise NotImplementedError(
                "Pass a build function, ScaledHyperModel(build_model, ...), or "
                "subclass ScaledHyperModel and override build(self, hp)."
            )
        return self._build_fn(hp)

    def declare_hyperparameters(self, hp):
        if self.precisions:
            hp.Choice("precision", self.precisions)
        if self.lr_rules:
            hp.Choice("lr_scaling", self.lr_rules)

    def fit(self, hp, model, *args, **kwargs):
        """Trains `model` with the trial's batch size through `kerascale.fit`;
        an infeasible batch gives an infeasible trial instead of a crash."""
        import kerascale

        x, y, kwargs = _split_data(args, kwargs)
        tuner_callback = _tuner_callback(kwargs.get("callbacks"))
        options = dict(self.fit_options)
        if self.precisions:
            options["precision"] = hp.Choice("precision", self.precisions)
        trained_x, trained_y = _training_part(x, y, kwargs.get("validation_split"))
        bound = self._bound(
            model, trained_x, trained_y, options.get("precision", "auto")
        )
        if self._declared_max is None:
            self._declared_max = self._range_max(bound)
        lo, _ = self.batch_range
        unseen = "batch_size" not in hp.values
        batch = hp.Int(
            "batch_size",
            min_value=lo,
            max_value=self._declared_max,
            step=self.batch_step,
            sampling="log" if self._declared_max > lo else "linear",
        )
        if unseen and kwargs.get("verbose", 1) != 0:
            self._say_batch(tuner_callback, batch, bound)
        if self.lr_rules:
            rule = hp.Choice("lr_scaling", self.lr_rules)
            options["lr_scaling"] = None if rule == "none" else rule
            options["base_batch_size"] = self.base_batch_size
        if not self.accumulate:
            if bound is not None and batch > bound:
                return self._infeasible(
                    tuner_callback,
                    model,
                    x,
                    y,
                    kwargs,
                    f"batch {batch} is larger than the {bound} that fits for this "
                    "model configuration (measured)"
                    if bound
                    else "not even a batch of 1 fits this model configuration "
                    "(measured)",
                )
            options["accumulation_steps"] = 1  # never split: a batch fits or not
        elif bound is not None:
            options["max_batch_size"] = bound  # larger batches: accumulation
        elif self.memory_limit is not None:
            options["memory_limit"] = self.memory_limit
        chosen = {"precision", "lr_scaling"} & set(options) - set(self.fit_options)
        for name in chosen & set(kwargs):
            raise ConfigurationError(
                f"{name} is tuned by ScaledHyperModel: do not pass it to "
                f"tuner.search. Received: {name}={kwargs[name]!r}"
            )
        # The search's arguments (verbose, callbacks, ...) win over the
        # hypermodel's defaults.
        options.update(kwargs)
        try:
            with options_lib.batch_chosen_by(f"this trial's hyperparameter ({batch})"):
                return kerascale.fit(model, x, y, batch_size=batch, **options)
        except Exception as e:
            if not _out_of_memory(e):
                raise
            return self._infeasible(
                tuner_callback,
                model,
                x,
                y,
                kwargs,
                f"batch {batch} ran out of memory: {type(e).__name__}: "
                f"{first_line(e)[:200]}",
            )

    def _say_batch(self, tuner_callback: Any, batch: int, bound: int | None) -> None:
        """Prints the trial's batch where its table did not show it:
        keras-tuner prints a trial's hyperparameters before the trial
        starts, and the batch's range is known only once the bound is
        measured on the data, in the first trial's `fit`."""
        trial_id = getattr(getattr(tuner_callback, "trial", None), "trial_id", "?")
        lo, _ = self.batch_range
        bounded = f", below the {bound} that fits" if bound else ""
        print(
            f"kerascale: trial {trial_id}: batch_size {batch} (of "
            f"{lo}..{self._declared_max}{bounded})",
            flush=True,
        )

    # --- the bound -------------------------------------------------------------

    def _bound(self, model: Any, x: Any, y: Any, precision: str) -> int | None:
        """The largest batch that fits for this model configuration and
        precision, measured once (and cached on disk by the batch search)."""
        import kerascale
        from kerascale.measure.cache import model_fingerprint

        key = (model_fingerprint(model)[:12], precision)
        if key not in self.bounds:
            _, hi = self.batch_range
            options = {k: v for k, v in self.fit_options.items() if k == "strategy"}
            try:
                result = kerascale.find_batch_size(
                    model,
                    x,
                    y,
                    mode="max",
                    max_batch_size=hi,
                    memory_limit=self.memory_limit,
                    precision=precision,
                    verbose=0,
                    **options,
                )
                self.bounds[key] = result.batch_size
            except BatchSizeSearchError as e:
                if not _out_of_memory(e):
                    raise  # a bug in the model, not memory: the user must see it
                self.bounds[key] = 0  # not even a batch of 1: every trial infeasible
            logger.info(
                "kerascale.tuner: largest batch that fits: %d", self.bounds[key]
            )
        return self.bounds[key]

    def _range_max(self, bound: int | None) -> int:
        """The declared range's top: the largest step of the range at or
        below the bound (the range's own min when even that does not fit)."""
        lo, hi = self.batch_range
        top = hi if bound is None or self.accumulate else min(hi, bound)
        value = lo
        while value * self.batch_step <= top:
            value *= self.batch_step
        return max(lo, value)

    # --- infeasible trials -----------------------------------------------------

    def _infeasible(self, tuner_callback, model, x, y, kwargs, reason: str):
        trial = getattr(tuner_callback, "trial", None)
        tuner = getattr(tuner_callback, "tuner", None)
        trial_id = getattr(trial, "trial_id", "?")
        self.infeasible[trial_id] = reason
        message = f"kerascale: trial {trial_id} is infeasible: {reason}."
        print(message, flush=True)
        if trial is not None:
            trial.message = message  # kept in the trial's trial.json
        objective = getattr(getattr(tuner, "oracle", None), "objective", None)
        results = {INFEASIBLE: 1.0}
        for obj in _objectives(objective):
            results[obj.name] = _worst(obj, tuner, model, x, y, kwargs)
        return results


# --- helpers ----------------------------------------------------------------


def _batch_range(value: Any) -> tuple[int, int]:
    accepted = "a (min, max) pair of ints with 1 <= min <= max"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise _validation.fail("batch_size", value, accepted)
    lo, hi = value
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _validation.fail("batch_size", value, accepted)
    if lo > hi:
        raise ConfigurationError(
            f"batch_size's min ({lo}) is larger than its max ({hi}). Received: "
            f"batch_size={tuple(value)}. Swap them: batch_size=({hi}, {lo})."
        )
    return lo, hi


def _as_list(name: str, value: Any) -> list:
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not value:
        raise _validation.fail(name, value, "a non-empty tuple or list of choices")
    return list(value)


def _choices(name: str, value: Any, allowed: Sequence[str]) -> list[str] | None:
    if value is None:
        return None
    choices = _as_list(name, value)
    for choice in choices:
        if choice not in allowed:
            raise _validation.fail(name, value, f"choices among {tuple(allowed)}")
    if len(set(choices)) != len(choices):
        raise _validation.fail(name, value, "choices without repeats")
    return choices


def _fit_options(options: dict[str, Any]) -> dict[str, Any]:
    import importlib

    fit = importlib.import_module("kerascale.fit").fit

    for name in _FROM_HP:
        if name in options:
            raise ConfigurationError(
                f"{name} is a hyperparameter of ScaledHyperModel, set by each "
                f"trial; pass it as ScaledHyperModel({name}=...) to tune it. "
                f"Received: {name}={options[name]!r}"
            )
    known = set(inspect.signature(fit).parameters) - {
        "model",
        "x",
        "y",
        "fit_kwargs",
        *_FROM_HP,
        "memory_limit",
    }
    for name in options:
        if name not in known:
            raise ConfigurationError(
                f"ScaledHyperModel got an unknown option {name}={options[name]!r}. "
                f"It accepts kerascale.fit's options: {', '.join(sorted(known))}. "
                "Arguments of model.fit (epochs, callbacks, validation_data...) go "
                "to tuner.search."
            )
    return dict(options)


def _split_data(args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any, dict]:
    kwargs = dict(kwargs)
    args = list(args)
    x = args.pop(0) if args else kwargs.pop("x", None)
    y = args.pop(0) if args else kwargs.pop("y", None)
    if args:
        raise ConfigurationError(
            "ScaledHyperModel.fit takes the data as x (and y) and everything else "
            "by keyword, as tuner.search(x, y, epochs=..., ...). Received "
            f"{len(args) + 2} positional arguments."
        )
    if "batch_size" in kwargs:
        raise ConfigurationError(
            "batch_size is the hyperparameter ScaledHyperModel tunes: do not pass "
            f"it to tuner.search. Received: batch_size={kwargs['batch_size']!r}"
        )
    return x, y, kwargs


def _training_part(x: Any, y: Any, validation_split: Any) -> tuple[Any, Any]:
    """The arrays `fit` trains on under `validation_split`: Keras holds back
    the last fraction (`floor(n * (1 - split))` train, as its
    `train_validation_split`), so the bound is searched for the samples that
    train, as fit holds them (it counted all of them). Data of another kind
    (a dataset refuses `validation_split`) is returned as it is."""
    from kerascale.sense.data_facts import is_dataset

    if not validation_split or is_dataset(x) or x is None:
        return x, y
    leaves = [a for a in keras.tree.flatten((x, y)) if hasattr(a, "shape")]
    if not leaves or not leaves[0].shape:
        return x, y
    keep = math.floor(int(leaves[0].shape[0]) * (1.0 - float(validation_split)))

    def head(a: Any) -> Any:
        return a[:keep] if hasattr(a, "shape") and a.shape else a

    trained = keras.tree.map_structure(head, (x, y))
    return trained[0], trained[1]


def _tuner_callback(callbacks: Any) -> Any:
    for callback in callbacks or ():
        if hasattr(callback, "tuner") and hasattr(callback, "trial"):
            return callback
    return None


def _out_of_memory(e: BaseException) -> bool:
    from kerascale.sense.oom import is_oom_exception

    if is_oom_exception(e):  # TensorFlow's ResourceExhaustedError, JAX's
        return True
    return isinstance(e, BatchSizeSearchError) and e.out_of_memory


def _objectives(objective: Any) -> list:
    if objective is None:
        return []
    return list(getattr(objective, "objectives", None) or [objective])


def _worst(objective: Any, tuner: Any, model: Any, x: Any, y: Any, kwargs) -> float:
    """The worst value of `objective` among the search's completed, feasible
    trials; without any, the untrained model's value; a finite number, so
    that Bayesian optimisation's model of the space stays sound."""
    seen = []
    oracle = getattr(tuner, "oracle", None)
    for trial in getattr(oracle, "trials", {}).values():
        if trial.status != "COMPLETED" or trial.metrics.exists(INFEASIBLE):
            continue
        if trial.metrics.exists(objective.name):
            value = trial.metrics.get_best_value(objective.name)
            if value is not None and math.isfinite(value):
                seen.append(value)
    if seen:
        return max(seen) if objective.direction == "min" else min(seen)
    return _untrained_value(objective, model, x, y, kwargs)


def _untrained_value(objective: Any, model: Any, x: Any, y: Any, kwargs) -> float:
    """The objective for `model` as it is, on a few small batches."""
    from kerascale.sense import data_facts

    name, data = objective.name, (x, y)
    if name.startswith("val_"):
        name = name[len("val_") :]
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)):
            data = (validation[0], validation[1])
        elif validation is not None:
            data = (validation, None)
    try:
        if data_facts.is_dataset(data[0]):
            ds = data[0]
            if not data_facts.inspect(ds, None).batched:
                ds = ds.batch(8)
            values = model.evaluate(ds.take(4), verbose=0, return_dict=True)
        else:
            sx, sy = (
                None if d is None else keras.tree.map_structure(lambda a: a[:256], d)
                for d in data
            )
            values = model.evaluate(sx, sy, batch_size=8, verbose=0, return_dict=True)
        value = float(values[name])
        if math.isfinite(value):
            return value
    except Exception as e:  # the fallback below is still a valid score
        warn(f"kerascale.tuner: evaluating the untrained model failed: {e}")
    return 0.0 if objective.direction == "max" else 1e6
