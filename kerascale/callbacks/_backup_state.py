"""The training state a `FaultTolerantBackup` checkpoint holds, written and
read the way the backend needs: the one place the backup's storage differs
between backends.

Its design: docs/design/modules.md, `kerascale.callbacks._backup_state`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import zipfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascale import _tf
from kerascale.apply.model import accumulation_steps
from kerascale.sense import backend as backend_lib
from kerascale.sense.model_facts import steps_per_call

ARRAYS_FILE = ".npz"
_MANIFEST = "__manifest__"


def _empty_history() -> dict[str, Any]:
    return {"epoch": [], "logs": {}}


@dataclasses.dataclass
class RunState:
    """A `FaultTolerantBackup`'s state for one training run (made anew at
    each `on_train_begin`): where training is, what is due, what a resume
    restored."""

    # The run, as Keras and the model give it (set at its start).
    chief: bool = True  # this worker writes the checkpoints
    spe: int = 1  # steps_per_execution: batches a train-function call applies
    k: int = 1  # gradient accumulation: batches an optimizer update takes
    epochs: int = 0
    epoch_steps: int | None = None  # batches an epoch has (None: unknown yet)
    # Where training is.
    active: bool = True  # until released (then the handlers pass everything on)
    epoch: int = 0
    step: int = 0  # batches of this epoch done, skipped ones included
    global_step: int = 0  # batches done in the whole run, across resumes
    completed_epochs: int = 0
    history: dict[str, Any] = dataclasses.field(default_factory=_empty_history)
    # Saving.
    next_number: int = 1  # the next checkpoint's number
    preempt_due: bool = False  # decided at an epoch's last batch: at its end
    damaged: set[str] = dataclasses.field(default_factory=set)  # not pruned
    # What a resume restored, and what it still has to do.
    skip_calls: int = 0  # train-function calls whose batches were applied
    last_call_skipped: bool = False
    # The input's position, restored at its iterator.
    pending_data: dict[str, Any] | None = None
    restored_metrics: bool = False  # the partial epoch's metrics to read back
    restore_pending: bool = False  # the state waits for the model to be built
    restored_finished_run: bool = False
    history_before: dict[str, Any] = dataclasses.field(default_factory=_empty_history)

    def read_run(self, model: keras.Model, params: dict[str, Any]) -> None:
        """The run as Keras (`params`) and the model give it, at its start."""
        self.chief = is_chief(model)
        self.spe = steps_per_call(model)
        self.k = accumulation_steps(model)
        self.epochs = int(params.get("epochs") or 0)
        self.epoch_steps = params.get("steps")

    def epoch_complete(self, exhausted: bool) -> bool:
        """Whether the running epoch is done (`exhausted`: its input ended)."""
        steps = self.epoch_steps
        return exhausted or (steps is not None and self.step >= steps)

    def end_epoch(self, epoch: int, logs: dict[str, Any] | None) -> None:
        """Records a complete epoch: only whole epochs go into the saved
        History (a resumed run reports the interrupted epoch itself when it
        completes it), and a full epoch tells how many batches one has."""
        self.history["epoch"].append(epoch)
        for key, value in (logs or {}).items():
            with contextlib.suppress(TypeError, ValueError):
                self.history["logs"].setdefault(key, []).append(float(value))
        self.completed_epochs = epoch + 1
        if self.epoch_steps is None:
            self.epoch_steps = self.step

    def at(self, *, boundary: bool, exhausted: bool) -> tuple[int, int]:
        """(epoch, step) a save records; `boundary`: at an epoch's end (or
        after it), where a complete epoch is saved as the next one's start."""
        if boundary and self.epoch_complete(exhausted):
            return self.epoch + 1, 0
        return self.epoch, self.step


def format_name() -> str:
    """The state format this backend writes: "tf" or "arrays"."""
    return backend_lib.traits().state_format


def is_chief(model: keras.Model) -> bool:
    """Whether this process publishes checkpoints: under a multi-worker
    strategy only the chief does (the others write to a temporary directory
    that is removed: a TensorFlow checkpoint write may be collective); on
    JAX, process 0."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None:
        return bool(getattr(strategy.extended, "should_checkpoint", True))
    if backend_lib.name() == "jax":
        import jax

        return jax.process_index() == 0
    return True


def sync(model: keras.Model) -> None:
    """Puts the training state into the model's variables where the backend
    keeps it elsewhere during `fit` (JAX passes it from step to step, and
    `jax_state_sync` is how Keras lets a callback read it)."""
    sync_state = getattr(model, "jax_state_sync", None)
    if callable(sync_state):
        sync_state()


def skipped_step(model: keras.Model, *state: Any) -> Any:
    """What Keras's train function returns for a step a resume skips (it was
    applied before the checkpoint): the metrics' values, and on JAX (which
    passes `state` in and takes it back) the state unchanged, whose metrics'
    values are the ones to report."""
    if not state:
        return model.get_metrics_result()
    (state,) = state
    mapping = list(zip(model.metrics_variables, state[3], strict=True))
    with keras.StatelessScope(state_mapping=mapping):
        return model.get_metrics_result(), state


def exhausted_errors() -> tuple[type[BaseException], ...]:
    """What Keras's train function raises when its input runs out."""
    if _tf.loaded():
        return (StopIteration, _tf.tf.errors.OutOfRangeError)
    return (StopIteration,)


def writer(objects: dict[str, Any], fmt: str) -> Callable[[str], dict[str, str]]:
    """The function that writes `objects` under a local path prefix, as they
    are when it is called (a synchronous save's, on the training thread),
    and returns the SHA-256 of the files it hashed as it wrote them."""
    if fmt == "tf":
        from kerascale._tf import tf

        checkpoint = tf.train.Checkpoint(**objects)

        def write_tf(prefix: str) -> dict[str, str]:
            checkpoint.write(prefix)
            return {}

        return write_tf

    def write(prefix: str) -> dict[str, str]:
        groups = {
            group: [keras.ops.convert_to_numpy(v.value) for v in variables]
            for group, variables in objects.items()
        }
        return _write_arrays(prefix, groups)

    return write


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The state a checkpoint holds, copied into host memory at a step's
    boundary: nothing in it is the model's, so the writer's thread writes it
    (`write`) while training goes on.

    Attributes:
        fmt: The state format, "tf" or "arrays".
        groups: Each group's values (`trackables`' groups but the iterator),
            in its variables' order: NumPy arrays that own their memory, or
            on JAX arrays being copied to the host (`ready` waits for them).
        iterator: The `tf.data` iterator's serialized state, or None.
        nbytes: The copy's size in host memory, in bytes.
    """

    fmt: str
    groups: dict[str, list[np.ndarray]]
    iterator: dict[str, Any] | None
    nbytes: int

    def ready(self) -> Snapshot:
        """This snapshot once every copy has arrived in host memory, as NumPy
        arrays (waits for the copies a JAX step's device is making)."""
        groups = {
            group: [np.asarray(v) for v in values]
            for group, values in self.groups.items()
        }
        return dataclasses.replace(self, groups=groups)

    def write(self, prefix: str) -> dict[str, str]:
        """Writes the state under a local path prefix, in the format a
        synchronous save writes (`read` reads either); returns the SHA-256
        of the files it hashed as it wrote them."""
        values = (v for vs in self.groups.values() for v in vs)
        if any(not isinstance(v, np.ndarray) for v in values):
            return self.ready().write(prefix)
        if self.fmt == "tf":
            from kerascale import _tf_compat

            _tf_compat.write_frozen(prefix, self.groups, self.iterator)
            return {}
        return _write_arrays(prefix, self.groups)


class HostBuffers:
    """The host memory an asynchronous save's copies go into, kept from one
    save to the next: a copy into pages already mapped costs a memcpy, where
    a fresh allocation costs a page fault a page besides (137 MiB of state
    on TensorFlow: about 120 ms against 30). A snapshot taken into them
    overwrites the one before: the backup takes one only once the save
    before it is written."""

    def __init__(self) -> None:
        self._arrays: dict[tuple[str, int], np.ndarray] = {}

    def copy(self, key: tuple[str, int], variable: Any) -> np.ndarray:
        """`variable`'s value now, copied into the buffer kept for `key`."""
        source = _value_now(variable)
        buffer = self._arrays.get(key)
        if (
            buffer is None
            or buffer.shape != source.shape
            or buffer.dtype != source.dtype
        ):
            buffer = self._arrays[key] = np.empty(source.shape, source.dtype)
        np.copyto(buffer, source)
        return buffer


def snapshot(
    objects: dict[str, Any], fmt: str, buffers: HostBuffers | None = None
) -> Snapshot:
    """`objects`' values copied into host memory: the training thread's part
    of an asynchronous save. Where the backend copies in flight (JAX) the
    copies are only started here, behind the step that computes the values;
    elsewhere they are made here, into `buffers` (a new one: fresh memory)."""
    buffers = buffers or HostBuffers()
    in_flight = backend_lib.traits().copies_in_flight
    groups, iterator, nbytes = {}, None, 0
    for group, value in objects.items():
        if group == "iterator":
            from kerascale import _tf_compat

            iterator = _tf_compat.iterator_state(value)
            continue
        groups[group] = [
            _copy_in_flight(variable)
            if in_flight
            else buffers.copy((group, i), variable)
            for i, variable in enumerate(value)
        ]
        nbytes += sum(int(a.nbytes) for a in groups[group])
    return Snapshot(fmt, groups, iterator, nbytes)


def _copy_in_flight(variable: Any) -> Any:
    """A copy of `variable`'s JAX value on the host's CPU device, started
    and not waited for (`jax.device_put`, a new buffer even where the value
    lives there already), which the next step's donation of the value
    cannot delete.

    A value replicated over several devices is copied from its first shard
    here: `device_put(may_alias=False)` of the whole to one of its own
    devices returns that device's buffer, not a copy (jax 0.10.2; pinned in
    test_compat_jax), and the next step deletes it ("Array has been
    deleted" at the write). That also covers a value replicated over
    several processes, whose whole `device_put` refuses to move to one
    device. A value split over processes is read as a synchronous save
    reads it."""
    import jax

    value = variable.value
    sharding = getattr(value, "sharding", None)
    if sharding is not None and len(sharding.device_set) > 1:
        if value.is_fully_replicated:
            value = value.addressable_shards[0].data
        elif not value.is_fully_addressable:
            return _value_now(variable)
    host = jax.local_devices(backend="cpu")[0]
    return jax.device_put(value, host, may_alias=False)


def _value_now(variable: Any) -> np.ndarray:
    """`variable`'s value as NumPy, a view where the backend gives one (a
    TensorFlow variable's read; its `numpy()` would copy, and `np.array` of
    it copies twice), to be copied at once."""
    value = variable.value
    read = getattr(value, "read_value", None)
    if callable(read):
        value = read()
    return np.asarray(value)


def _write_arrays(prefix: str, groups: dict[str, list[np.ndarray]]) -> dict[str, str]:
    """Writes the "arrays" format, a NumPy .npz: every group's values, with a
    manifest of the groups' sizes and the dtypes .npy cannot name. Each
    array's bytes go from its own memory to the file and the SHA-256 in one
    pass (`np.savez` copies each array in chunks first: 0.35 s for 137 MiB
    against about 0.1 s); returns {file name: SHA-256}."""
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for group, values in groups.items():
        for i, value in enumerate(values):
            key = f"{group}.{i}"
            if np.dtype(value.dtype.str) != value.dtype:
                # bfloat16, float8 (ml_dtypes): .npy would keep only bytes
                dtypes[key] = value.dtype.name
                value = value.view(f"u{value.dtype.itemsize}")
            arrays[key] = value
    manifest = {g: len(v) for g, v in groups.items()}
    arrays[_MANIFEST] = np.array(json.dumps({"groups": manifest, "dtypes": dtypes}))
    path = prefix + ARRAYS_FILE
    with open(path, "wb") as f:  # flushed to disk by the store
        hashing = _Hashing(f)
        # Not seekable: zipfile writes each member's sizes after it.
        with zipfile.ZipFile(hashing, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for key, value in arrays.items():
                if not value.flags.c_contiguous:
                    value = value.copy(order="C")  # ascontiguousarray makes 0-d 1-d
                with z.open(key + ".npy", "w", force_zip64=True) as member:
                    header = np.lib.format.header_data_from_array_1_0(value)
                    try:
                        np.lib.format.write_array_header_1_0(member, header)
                    except ValueError:  # a header of over 64 KiB
                        np.lib.format.write_array_header_2_0(member, header)
                    if value.nbytes:
                        member.write(memoryview(value.reshape(-1)).cast("B"))
    return {os.path.basename(path): hashing.digest.hexdigest()}


class _Hashing:
    """A file that hashes what is written to it, for zipfile (which takes a
    file with no `tell` for one it cannot seek back in)."""

    def __init__(self, f: Any):
        self._f, self.digest = f, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.digest.update(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def read(prefix: str, objects: dict[str, Any], fmt: str) -> None:
    """Reads the state under `prefix` into `objects`' variables (every group
    given; others in the file are left). Raises ValueError when the file does
    not hold what `objects` needs (a group missing, a count or shape that
    differs)."""
    if fmt == "tf":
        from kerascale._tf import tf

        status = tf.train.Checkpoint(**objects).read(prefix)
        status.expect_partial()
        status.assert_existing_objects_matched()
        return
    if fmt != "arrays":
        raise ValueError(f"its state format {fmt!r} is unknown to this kerascale")
    with np.load(prefix + ARRAYS_FILE, allow_pickle=False) as saved:
        manifest = json.loads(str(saved[_MANIFEST]))
        values = []
        for group, variables in objects.items():
            count = manifest["groups"].get(group)
            if count != len(variables):
                raise ValueError(
                    f"its state holds {count} {group} variable(s), and this run "
                    f"has {len(variables)}"
                )
            for i, variable in enumerate(variables):
                key = f"{group}.{i}"
                value = saved[key]
                if key in manifest["dtypes"]:
                    value = value.view(_dtype(manifest["dtypes"][key]))
                if tuple(value.shape) != tuple(variable.shape):
                    raise ValueError(
                        f"its {group} variable {i} ({variable.path}) has shape "
                        f"{tuple(value.shape)}; this run's has {tuple(variable.shape)}"
                    )
                values.append((variable, value))
    for variable, value in values:  # all checked before any is changed
        variable.assign(value)


def read_metrics(prefix: str, variables: list[Any], fmt: str) -> None:
    """Reads the metrics' values under `prefix` into `variables`."""
    if fmt == "tf":
        from kerascale._tf import tf

        tf.train.Checkpoint(metrics=variables).read(prefix).expect_partial()
        return
    read(prefix, {"metrics": variables}, fmt)


def _dtype(name: str) -> np.dtype:
    import ml_dtypes  # a Keras dependency: bfloat16 and float8 for NumPy

    return np.dtype(getattr(ml_dtypes, name))
