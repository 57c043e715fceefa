"""Every private Keras name kerascale uses, each with the reason.

1. Keras 3 + `tf.distribute.MultiWorkerMirroredStrategy`: the smallest fix.

Upstream: keras-team/keras#20585 (open), ray-project/ray#47464. With Keras 3
(reproduced on 3.15.1 with TensorFlow 2.21), `model.fit` under
MultiWorkerMirroredStrategy fails twice:

1. `TensorFlowTrainer._maybe_symbolic_build` reduces the first (PerReplica)
   batch with `strategy.reduce("MEAN", batch, axis=None)` only to learn its
   shapes; under the multi-worker strategy that fails ("Attempt to convert a
   value (PerReplica ...)"). One replica's local batch has the shapes needed.
2. `reduce_per_replica` reduces the step's scalar logs with
   `strategy.reduce("MEAN", v, axis=0)`, and axis 0 of a scalar does not
   exist. `axis=None` averages them across replicas.

`apply()` replaces exactly these two functions, only for the Keras versions
whose source it was written against (checked by hash, so a changed upstream
is never patched blindly), and only in multi-worker mode; everything else
still runs Keras's code. `tests/test_compat.py` fails when upstream changes
them, so this section is revisited; delete it once keras#20585 is fixed.

2. Model internals that `FaultTolerantBackup` and model re-creation need,
where Keras has no public way (listed in `PRIVATE_NAMES`, which
`tests/test_compat.py` checks exist):

- `Model._initial_epoch`: the epoch `fit` starts at, how Keras's own
  `BackupAndRestore` resumes (keras#19179). Set here tied to one `fit` call.
- Keras's global seed generator (`keras.src.random.seed_generator`): the
  state unseeded `keras.random` ops draw from, checkpointed for an exact
  resume.
- `Model._symbolic_build`, `Model._flatten_layers`, `Model._compile_metrics`,
  `Model._compile_loss`: building the variables the first step would create,
  so that a checkpoint can be restored before that step runs, and (JAX) so
  that Keras's fit does not read a batch to build them from a `cache()`
  kerascale added, which TensorFlow then warns it discarded.
  `_flatten_layers` also lists every layer a precision set in place must
  reach (a subclassed model's sublayers are listed nowhere public).
  `keras.src.models.functional.Functional`: the class a keras-hub task or
  backbone subclasses, whose output layers stay float32 when a precision is
  set in place (Keras exports no such class).
- `Model._compile_config`: the arguments `compile` received, to re-compile a
  re-created model when the compile config does not round-trip (unregistered
  custom losses); made anew by each `compile`, so its identity also tells a
  second `kerascale.fit` whether its traced functions still hold.
- `Layer._layers`: the layers a custom layer holds as attributes, for the
  probe child's search of every class the model uses.

3. Gradient accumulation on an optimizer Keras did not build for it, and
under tf.distribute (`kerascale.apply.accumulation` uses these; listed in
`PRIVATE_NAMES`):

- `Optimizer._learning_rate`: the schedule object (the public `learning_rate`
  is its current value), to wrap it per update; `Optimizer._iterations`: the
  step counter as a variable (the public `iterations` is its value), recounted
  in micro-steps while accumulation is on.
- `Optimizer._trainable_variables`, `_accumulated_gradients`,
  `_backend_reset_gradient_accumulators`: Keras makes the accumulators only
  in `build`; switching accumulation on for a built optimizer makes them as
  `build` would, and ending a run on a whole window zeroes them.
- keras-team/keras#20582 (open): with `gradient_accumulation_steps` under a
  tf.distribute strategy, Keras's `_backend_apply_gradients` calls
  `merge_call` inside `ops.cond` ("merge_call called while defining a new
  graph"). `fix_distributed_accumulation` replaces it on that optimizer
  object only, with Keras's own steps in the order tf.distribute allows
  (`_get_variable_index`, `_clip_gradients`, `_apply_weight_decay`,
  `_backend_update_step`, `_backend_increment_gradient_accumulators`,
  `_update_model_variables_moving_average`, `_distribution_strategy`).

4. A model built before a `keras.distribution` was set, on JAX.

Keras's JAX variables take their layout when they are created under a
distribution (`Variable._layout`, read by `Variable._direct_assign`); a
model built before `fit` holds variables on one device, and Keras's JAX
trainer then fails at the first step ("Received incompatible devices for
jitted computation"; its own warning asks to build the model under the
distribution). Keras has no public way to lay out an existing variable.
`lay_out` gives each such variable the layout the distribution would have
given it and places its value so; the undo puts every variable back on the
device it was on, so that the model is as before, plus the trained values.

5. Recomputation (rematerialization) on a model built without it.

Keras's public switch is `keras.RematScope`, read once, when a layer is
constructed (`Operation.__init__` stores it as `Operation._remat_mode`, and
every call reads that attribute); a model built outside a scope has no
public way to turn it on, and re-building it is what kerascale never does.
`set_remat` sets that attribute, to the value a `RematScope` would have
given (`keras.src.backend.common.remat.RematMode`), on the layers named, and
its undo puts back each layer's own. Checked by tests/test_compat.py and
tests_jax/test_compat_jax.py (the memory a compiled step needs drops, and
the undo restores it).

6. What Keras's `fit` builds from arrays, and Keras's JAX state after a
failed `fit`.

- `keras.src.trainers.data_adapters.get_data_adapter`: Keras exports no way
  to build the pipeline its `fit` makes of arrays (on TensorFlow a dataset
  holding a copy of them), which the batch search must count in the process
  where `fit` trains (`read_like_fit`; `kerascale.measure.host_share`).
- `Variable._value` (JAX backend): `fit` empties the variables while it
  trains and leaves them empty when its first step raises (`StateGuard`).

7. A generator under a tf.distribute strategy (`generator_feed`): Keras
reads the first batch through an iterator it drops, and a generator's
batches that iterator read ahead are lost, a racy number of them. The
generator is fed as a dataset whose iterators all read it from its first
batch (`data_adapter_utils.get_tensor_spec`, `NUM_BATCHES_FOR_TENSOR_SPEC`:
Keras's own spec of it).

8. Keras's serialization imports TensorFlow on another backend
(keras#18455): `serialization.tensorflow_left_unimported`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import inspect
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import keras
import numpy as np

from kerascale import _tf_compat
from kerascale._keras_compat.trainers import tf_trainer_class
from kerascale.errors import warn

logger = logging.getLogger("kerascale")

UPSTREAM_ISSUE = "https://github.com/keras-team/keras/issues/20585"
# Source hashes (sha256, first 16 hex digits) of the functions this module
# replaces, as in the Keras versions it was written for.
PATCHED = {
    "TensorFlowTrainer._maybe_symbolic_build": {"92a504f5eba9b29f"},
    "reduce_per_replica": {"2e7d54b1e6edc29a"},
}

_applied = False


def upstream_changed() -> list[str]:
    """The patched functions whose upstream source is not one we know."""
    from keras.src.backend.tensorflow import trainer

    trainer_class = tf_trainer_class()
    current = {
        "TensorFlowTrainer._maybe_symbolic_build": trainer_class._maybe_symbolic_build,
        "reduce_per_replica": trainer.reduce_per_replica,
    }
    return [name for name, fn in current.items() if _digest(fn) not in PATCHED[name]]


def apply() -> bool:
    """Installs the two fixes (idempotent). Returns whether they are active;
    False (with a warning) when this Keras's code is not the code they fix."""
    global _applied
    if _applied:
        return True
    changed = upstream_changed()
    if changed:
        warn(
            f"kerascale's multi-worker fix for Keras ({UPSTREAM_ISSUE}) was "
            f"written for other versions of {', '.join(changed)}; not applied. "
            "If multi-worker fit fails, report it with your Keras version."
        )
        return False
    from keras.src.backend.tensorflow import trainer

    trainer_class = tf_trainer_class()
    original_build = trainer_class._maybe_symbolic_build
    original_reduce = trainer.reduce_per_replica

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or not trainer._collective_all_reduce_multi_worker(
            strategy
        ):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = _first_replica(next(it), strategy)
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction in (
            "auto",
            "mean",
        ) and trainer._collective_all_reduce_multi_worker(strategy):
            return _mean_across_replicas(values, strategy)
        return original_reduce(values, strategy, reduction)

    trainer_class._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica
    _applied = True
    return True


def _first_replica(batch: Any, strategy: Any) -> Any:
    import tensorflow as tf
    from keras.src import tree

    def local(v):
        if isinstance(v, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(v)[0]
        return v

    return tree.map_structure(local, batch)


def _mean_across_replicas(values: Any, strategy: Any) -> Any:
    import tensorflow as tf
    from keras.src import tree

    def mean(v):
        if isinstance(v, (tf.Tensor, tf.distribute.DistributedValues)):
            return strategy.reduce("MEAN", v, axis=None)
        return v

    return tree.map_structure(mean, values)


def _digest(fn: Any) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]


# --- 2. Model internals -------------------------------------------------------

PRIVATE_NAMES = (
    "keras.Model._initial_epoch (set by fit)",
    "keras.Model._symbolic_build",
    "keras.Model._flatten_layers",
    "keras.Model._compile_metrics (after compile)",
    "keras.Model._compile_loss (after compile)",
    "keras.Model._compile_config (after compile)",
    "keras.Layer._layers (the layers it tracks)",
    "keras.src.models.functional.Functional",
    "keras.src.random.seed_generator.global_seed_generator",
    "keras.src.backend.common.global_state.get_global_attribute, "
    "set_global_attribute (global_seed_generator, object_name_uids)",
    "keras.Optimizer._learning_rate, _trainable_variables (after build)",
    "keras.Optimizer._iterations (a variable)",
    "keras.Optimizer._accumulated_gradients (built with accumulation)",
    "keras.Optimizer._backend_apply_gradients, _backend_update_step",
    "keras.Optimizer._backend_reset_gradient_accumulators, "
    "_backend_increment_gradient_accumulators",
    "keras.Optimizer._get_variable_index, _clip_gradients, _apply_weight_decay, "
    "_update_model_variables_moving_average",
    "keras.Optimizer._distribution_strategy (TensorFlow backend, after build)",
    "keras.Variable._layout, _direct_assign, _value (JAX backend)",
    "keras.Operation._remat_mode, keras.src.backend.common.remat.RematMode",
    "keras.src.trainers.data_adapters.get_data_adapter",
    "keras.Variable._value emptied by a JAX fit whose first step raises",
)
ACCUMULATION_METHODS = (
    "_backend_apply_gradients",
    "_backend_update_step",
    "_backend_reset_gradient_accumulators",
    "_backend_increment_gradient_accumulators",
    "_get_variable_index",
    "_clip_gradients",
    "_apply_weight_decay",
    "_update_model_variables_moving_average",
)


class _EpochOfRun(int):
    """An initial epoch that Keras reads as set only while the `fit` call it
    was set for runs: Keras reads `model._initial_epoch or initial_epoch`, so
    a `fit` that raised before reading it cannot make a later `fit` skip
    epochs."""

    def __new__(cls, value: int, alive: Callable[[], bool]) -> _EpochOfRun:
        obj = super().__new__(cls, value)
        obj.alive = alive
        return obj

    def __bool__(self) -> bool:
        return int(self) != 0 and bool(self.alive())


def set_initial_epoch(model: Any, epoch: int, alive: Callable[[], bool]) -> None:
    """Makes the running `fit` start at `epoch`; `alive()` says whether that
    `fit` call still runs (afterwards the setting is ignored)."""
    model._initial_epoch = _EpochOfRun(epoch, alive)


def clear_initial_epoch(model: Any) -> None:
    """Takes back an initial epoch set by `set_initial_epoch`."""
    if isinstance(getattr(model, "_initial_epoch", None), _EpochOfRun):
        model._initial_epoch = None


def existing_global_seed_generator() -> Any:
    """Keras's global seed generator if something created it, else None
    (asking `global_seed_generator()` would create one, drawing its seed
    from Python's random module)."""
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


def forget_global_seed_generator() -> None:
    """Takes out Keras's global seed generator, as before anything created
    it (`random_kept`, where kerascale's own read created it)."""
    from keras.src.backend.common import global_state

    global_state.set_global_attribute("global_seed_generator", None)


@contextlib.contextmanager
def random_kept() -> Iterator[None]:
    """Restores Python's, NumPy's and Keras's global random states on exit
    (Keras's seed generator: its state, or its absence where it did not
    exist), and TensorFlow's eager op-seed sequence where it is loaded:
    reading the user's input to fingerprint it (a `PyDataset` whose batches
    draw random augmentations) leaves no trace in training."""
    py, np_state = random.getstate(), np.random.get_state()
    generator = existing_global_seed_generator()
    state = None if generator is None else generator.state.value
    seed = None if state is None else np.array(keras.ops.convert_to_numpy(state))
    try:
        with _tf_compat.op_seeds_kept():  # TensorFlow's op seeds, where loaded
            yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        if generator is None:
            forget_global_seed_generator()
        else:
            generator.state.assign(seed)


_F = TypeVar("_F", bound=Callable[..., Any])


def leaves_no_trace(fn: _F) -> _F:
    """`fn` run under `random_kept`: what a measurement draws (a copy of the
    model trained on shuffled arrays, a seed generator's step) is not drawn
    from the random states the user's training then reads (issue 80)."""

    @functools.wraps(fn)
    def kept(*args: Any, **kwargs: Any) -> Any:
        with random_kept():
            return fn(*args, **kwargs)

    return kept  # type: ignore[return-value]


@contextlib.contextmanager
def names_kept() -> Iterator[None]:
    """Puts back Keras's counters of automatic names on exit: models and
    layers that kerascale makes for itself must not rename the user's next
    ones ("functional_3" for "functional_2")."""
    from keras.src.backend.common import global_state

    counters = global_state.get_global_attribute("object_name_uids")
    before = dict(counters) if counters is not None else None
    try:
        yield
    finally:
        now = global_state.get_global_attribute("object_name_uids")
        if now is not None:
            now.clear()
            now.update(before or {})


def global_seed_generator() -> Any:
    """Keras's global seed generator, created if missing."""
    from keras.src.random import seed_generator

    return seed_generator.global_seed_generator()


def fully_built(model: Any) -> bool:
    """Whether the model and every layer in it are built."""
    return model.built and all(layer.built for layer in model._flatten_layers())


def build_pending(model: Any) -> bool:
    """Whether Keras's JAX `fit` would read a batch to build `model` before
    its first epoch. Keras 3.15 (`Trainer._symbolic_build`): a layer, the
    compiled loss or the compiled metrics not yet built. Keras 3.16
    (`JAXTrainer._maybe_symbolic_build`): any of `_get_unbuilt_components`,
    the optimizer's slots included. That read creates an iterator and
    drops it (for shuffled arrays, Keras 3.15 draws the first epoch's order
    from NumPy's global state there)."""
    if _reads_from_adapter(model):
        try:
            return any(model._get_unbuilt_components())
        except AttributeError:
            return False
    try:
        layers = model._flatten_layers()
    except AttributeError:
        return False
    metrics = getattr(model, "_compile_metrics", None)
    loss = getattr(model, "_compile_loss", None)
    return (
        not all(layer.built for layer in layers)
        or (metrics is not None and not metrics.built)
        or (loss is not None and not loss.built)
    )


def _reads_from_adapter(model: Any) -> bool:
    """Whether this Keras's JAX `fit` reads its build batch straight from
    the data adapter (`_maybe_symbolic_build`, Keras 3.16) rather than
    through the epoch's iterator (Keras 3.15)."""
    return callable(getattr(type(model), "_maybe_symbolic_build", None))


class ReadToBuild:
    """Does at a `fit`'s start the read Keras's JAX `fit` does to build
    `model`, where kerascale's measurement built the model and Keras skips
    it: Keras 3.15 reads one batch through the first epoch's iterator
    (`_symbolic_build(iterator=...)`) and resets it, Keras 3.16 one from a
    fresh iterator of the data adapter (`_maybe_symbolic_build`), then
    `fit` resets the epoch's iterator whether or not it read. So the epochs
    draw their orders as in a `fit` that measured nothing (issue 80). Called from
    a callback's `on_train_begin`, on the `EpochIterator` of the `fit` below
    it (`epoch_order.fit_epoch_iterator`)."""

    def __init__(self, model: Any):
        self.model = model
        self.done = False

    def __call__(self) -> None:
        from kerascale._keras_compat import epoch_order

        if self.done:
            return
        self.done = True
        iterator = epoch_order.fit_epoch_iterator()
        if iterator is None:
            return
        if _reads_from_adapter(self.model):
            # Its epoch's iterator is untouched: no reset, which would also
            # move the adapter's epoch counter (`on_epoch_end`), the order of
            # every epoch from Keras 3.16 (Keras's own reset has run).
            next(iter(iterator.data_adapter.get_jax_iterator()), None)
            return
        for item in iterator:
            data = item[-1]
            if not isinstance(data, list | tuple):
                next(data)
            break
        iterator.reset()


def build_like_first_step(model: Any, element_spec: Any) -> None:
    """Builds what Keras builds while tracing the first training step
    (layers, compiled metrics, optimizer slots) under the model's strategy."""
    compiled = [getattr(model, a, None) for a in ("_compile_metrics", "_compile_loss")]
    unbuilt = not fully_built(model) or any(
        c is not None and not c.built for c in compiled
    )
    strategy = getattr(model, "distribute_strategy", None)  # None on JAX
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        if unbuilt and element_spec is not None:
            model._symbolic_build(data_batch=element_spec)
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)


def all_layers(model: Any) -> list[Any]:
    """The model and every layer it holds, nested ones included, in a fixed
    order (`Layer._flatten_layers`): Keras lists a subclassed model's
    sublayers nowhere public, and a precision set in place must reach them."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def child_layers(layer: Any) -> list[Any]:
    """The layers `layer` holds directly (`Layer._flatten_layers`, not
    recursive): a custom layer's sublayers, which it lists nowhere public."""
    return list(layer._flatten_layers(include_self=False, recursive=False))


def is_graph_model(layer: Any) -> bool:
    """Whether `layer` is a Functional model or a subclass of it (a keras-hub
    task or backbone): Keras exports no public class to test against."""
    from keras.src.models.functional import Functional

    return isinstance(layer, Functional)


def tracked_layers(layer: Any) -> list[Any]:
    """The layers a layer tracks as attributes (`Layer._layers`), which a
    custom layer that is not a model lists nowhere public."""
    return list(getattr(layer, "_layers", None) or ())


def compile_token(model: Any) -> Any:
    """An object that `compile` makes anew each time (`_compile_config`), so
    that its identity tells whether the model was compiled again."""
    return getattr(model, "_compile_config", None)


def last_step_of_call(params: dict[str, Any] | None, batch: int) -> int:
    """The index of the last step a call of the train (or test) function
    ran, from the `batch` Keras's `on_*_batch_end` hook got. Keras gives
    `begin + steps_per_execution - 1` even where the epoch ended sooner
    (`EpochIterator._enumerate_iterator`, Keras 3.15: an epoch of 20 steps
    at 8 a call ends with the hook's batch 23); `params["steps"]`, the
    epoch's steps where known, bounds it. No upstream issue reports it;
    `tests/test_compat.py` checks that Keras still does so."""
    steps = (params or {}).get("steps")
    if isinstance(steps, int) and steps > 0:
        return min(batch, steps - 1)
    return batch


def steps_of_call(params: dict[str, Any] | None, first: int, batch: int) -> int:
    """The steps a call ran that began at step `first` and whose end hook
    got `batch` (`last_step_of_call`), at least 1."""
    return max(1, last_step_of_call(params, batch) - first + 1)


def super_batch(model: Any) -> int:
    """The steps each read of Keras's JAX input iterator holds, where Keras
    stacks a call's batches into one read (keras-nightly 3.16: with
    `steps_per_execution=N` its JAX data adapters yield N batches stacked,
    or a `PartialBatchList` of what is left, and its train function scans
    them); 0 where a read is one batch (Keras 3.15, TensorFlow, one step a
    call). Told by the adapters' `get_jax_iterator(super_batch=...)`."""
    import inspect

    if keras.backend.backend() != "jax":
        return 0
    n = getattr(model, "steps_per_execution", 1)
    if not isinstance(n, int) or n <= 1:
        return 0
    from keras.src.trainers.data_adapters.data_adapter import DataAdapter

    taken = inspect.signature(DataAdapter.get_jax_iterator).parameters
    return n if "super_batch" in taken else 0


def steps_in_read(item: Any, super_batch: int) -> int:
    """The steps one read of Keras's JAX iterator holds (`super_batch`):
    a stacked read's leading size, a `PartialBatchList`'s length; 1 where
    reads are not stacked."""
    if not super_batch:
        return 1
    if type(item).__name__ == "PartialBatchList":
        return len(item)
    leaves = [leaf for leaf in keras.tree.flatten(item) if hasattr(leaf, "shape")]
    return int(leaves[0].shape[0]) if leaves and len(leaves[0].shape) else 1


def tensorboard_profiles(callback: Any) -> bool:
    """Whether Keras's `TensorBoard` callback profiles a window of batches
    (`profile_batch`, kept only as `_start_batch`/`_stop_batch`; no public
    reader, and no upstream issue asks for one): counted in calls where a
    call runs several steps."""
    return bool(
        getattr(callback, "_start_batch", 0) or getattr(callback, "_stop_batch", 0)
    )


def compile_arguments(model: Any) -> dict[str, Any]:
    """The arguments the model's `compile` received, as objects."""
    return dict(model._compile_config.config)


# --- 3. Gradient accumulation ---------------------------------------------------


def learning_rate_object(optimizer: Any) -> Any:
    """The optimizer's learning rate as set: a schedule, a callable, a
    variable or a number (`_learning_rate`)."""
    return optimizer._learning_rate


def iterations_variable(optimizer: Any) -> Any:
    """The optimizer's step counter as a variable (`_iterations`; the public
    `iterations` is its value), to recount it in micro-steps and back."""
    return optimizer._iterations


def accumulators(optimizer: Any) -> list[Any]:
    """The optimizer's gradient accumulators (empty without accumulation)."""
    return list(getattr(optimizer, "_accumulated_gradients", None) or ())


def add_accumulators(opt: Any) -> None:
    """Makes a built optimizer's accumulators, as its `build` makes them
    when `gradient_accumulation_steps` is set, in the strategy it was built
    in (TensorFlow; on JAX, the distribution set now lays them out)."""
    variables = opt._trainable_variables
    dist = getattr(opt, "_distribution_strategy", None)
    if dist is None and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        dist = tf.distribute.get_strategy()
    with dist.scope() if dist is not None else contextlib.nullcontext():
        opt._accumulated_gradients = [
            opt.add_variable_from_reference(v, name="gradient_accumulator")
            for v in variables
        ]


def reset_accumulators(optimizer: Any) -> None:
    """Zeroes the optimizer's accumulators."""
    optimizer._backend_reset_gradient_accumulators()


# keras#20582 (TensorFlow): in distributed_accumulation.py, re-exported here.
from kerascale._keras_compat.distributed_accumulation import (  # noqa: E402
    fix_distributed_accumulation as fix_distributed_accumulation,
)
from kerascale._keras_compat.distributed_accumulation import (  # noqa: E402
    unfix_distributed_accumulation as unfix_distributed_accumulation,
)
from kerascale._keras_compat.generator_feed import (  # noqa: E402
    replayed as replayed,
)

# 4. (JAX backend) in jax_variables.py, re-exported here.
from kerascale._keras_compat.jax_variables import (  # noqa: E402
    StateGuard as StateGuard,
)
from kerascale._keras_compat.jax_variables import (  # noqa: E402
    lay_out as lay_out,
)
from kerascale._keras_compat.jax_variables import (  # noqa: E402
    model_variables as model_variables,
)
from kerascale._keras_compat.jax_variables import (  # noqa: E402
    train_state as train_state,
)

# 8. keras#18455 (another backend): in serialization.py, re-exported here.
from kerascale._keras_compat.serialization import (  # noqa: E402
    tensorflow_left_unimported as tensorflow_left_unimported,
)


def read_like_fit(
    x: Any, y: Any, batch: int, shuffle: Any, backend: str, batches: int
) -> Any:
    """Builds the pipeline Keras's `fit` makes of arrays at `batch`
    (`get_data_adapter`, then its TensorFlow dataset or its JAX iterator),
    reads `batches` batches from it, and returns what holds them."""
    from keras.src.trainers.data_adapters import get_data_adapter

    adapter = get_data_adapter(x=x, y=y, batch_size=batch, shuffle=shuffle)
    if backend == "tensorflow":
        iterator = iter(adapter.get_tf_dataset())
    else:
        iterator = adapter.get_jax_iterator()
    # A step's batch and the next one: what training holds at once.
    held = collections.deque(maxlen=2)
    held.extend(b for b, _ in zip(iterator, range(batches), strict=False))
    return adapter, iterator, list(held)


def set_remat(layers: list[Any], mode: str) -> Any:
    """Sets recomputation `mode` ("activations" or "full", as
    `keras.RematScope` takes it) on `layers`, as a scope around their
    construction would have; returns the undo, which puts back each one's
    own setting."""
    from keras.src.backend.common import remat

    before = [(layer, layer._remat_mode) for layer in layers]
    setting = remat.RematMode(mode, 1024, [])
    for layer in layers:
        layer._remat_mode = setting

    def undo() -> None:
        for layer, own in before:
            layer._remat_mode = own

    return undo


def remat_mode(layer: Any) -> Any:
    """The layer's recomputation setting (None without one)."""
    return layer._remat_mode
