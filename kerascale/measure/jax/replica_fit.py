"""Whether one replica fits a device, and if not, the mesh to shard over, by
the compiler's count (JAX).

Its design: docs/design/modules.md, `kerascale.measure.jax.replica_fit`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import keras

from kerascale._units import format_bytes
from kerascale.apply.session import Session
from kerascale.errors import BatchSizeSearchError, ConfigurationError
from kerascale.measure import cache
from kerascale.measure.jax import compiled
from kerascale.measure.request import SearchOptions
from kerascale.plan import model_sharding as sharding
from kerascale.plan.measured import Measured
from kerascale.plan.reasons import Reason
from kerascale.sense.model_facts import gist

if TYPE_CHECKING:
    from kerascale.plan.options import Options
    from kerascale.plan.plan import Plan
    from kerascale.plan.planner import Planner
    from kerascale.sense.hardware import Hardware

# kerascale's own choices, which it may replace by a sharded one; a
# distribution of yours is used as it is.
REPLACEABLE = ("default", "data_parallel")
KIND = "jax-sharding-1"  # the cache's folder for these decisions


@dataclasses.dataclass(frozen=True)
class DeviceRoom:
    """What one device may hold for the model's step.

    Attributes:
        usable: Bytes, the margin taken off.
        source: Where the figure comes from, in words.
        search: The search's options (None: none asked for).
    """

    usable: int
    source: str
    search: SearchOptions | None


def plan_sharding(
    model: Any,
    x: Any,
    y: Any,
    options: Options,
    planner: Planner,
    search: SearchOptions | None,
) -> tuple[Any, Measured]:
    """(options, what was found): `options` as they are where one replica
    fits a device (the finding says so where `device_memory` was given),
    else with `options.strategy` the request (`sharding.Sharded`) for the
    mesh that fits and trains fastest. The
    decision is kept in kerascale's cache, by the model, the data's shapes,
    the hardware, the plan and the device's limit: a later run makes none of
    its compiles.

    Where the check cannot decide (the model's step fails to compile here,
    or nothing fits a device whose memory you did not give), the plan stays
    as it is, with one warning: the run then does what plain `fit` does.

    Raises:
        ConfigurationError: Where even the largest model axis does not fit
            the `device_memory` you gave.
    """
    hw, data = planner.hardware, planner.data
    plan = planner(options)
    if isinstance(options.strategy, sharding.Sharded):  # decided before: again
        chosen = Reason("sharding.chosen", why=options.strategy.why)
        return options, Measured().decided(sharding=chosen)
    limit, source = _device_limit(hw, search)
    if limit is None or plan.strategy not in REPLACEABLE or not data.measurable:
        return options, Measured()
    margin = search.margin if search is not None else 0.0
    usable = int(limit * (1 - margin))
    element = compiled.element_of(x, y)
    yours = search is not None and bool(search.device_memory)
    key = _key(model, element, plan, hw, (limit, source, margin))
    decided = _cached(key, search)
    if decided is None:
        try:
            room = DeviceRoom(usable, source, search)
            decided = _decide(model, (options, plan), planner, element, room)
        except BatchSizeSearchError as e:  # the model's own failure: fit raises it
            return options, Measured().warned(f"no sharding check: {e}")
        except ConfigurationError as e:
            if yours:
                raise
            return options, Measured().warned(f"{e} Trained as planned, unsharded.")
        if search is None or search.cache:
            cache.cache_write(KIND, key, _as_json(*decided))
    one, request = decided
    if request is not None:
        trial = dataclasses.replace(options, strategy=request)
        chosen = Reason("sharding.chosen", why=request.why)
        return trial, Measured().decided(sharding=chosen)
    if not yours:
        return options, Measured()
    why = Reason(
        "sharding.fits",
        need=format_bytes(one),
        source=source,
        limit=format_bytes(limit),
        margin=margin,
    )
    return options, Measured().decided(sharding=why)


def _decide(
    model: Any,
    planned: tuple[Options, Plan],
    planner: Planner,
    element: Any,
    room: DeviceRoom,
) -> tuple[int, sharding.Sharded | None]:
    """(one replica's bytes per device, the sharded request or None where
    one replica fits `room`), by compiling (and timing) the step."""
    options, plan = planned
    one = _per_device(model, element, plan, 1)
    if one <= room.usable:
        return one, None
    return one, _sharded(model, options, planner, element, one, room)


def _key(model: Any, element: Any, plan: Plan, hw: Hardware, limit: tuple) -> str:
    """The decision's cache key: the model, the data's shapes, the hardware
    and processes, the plan it starts from, and the device's limit."""
    import jax

    shapes = keras.tree.map_structure(
        lambda leaf: (tuple(leaf.shape), str(leaf.dtype)), element
    )
    return cache.cache_key(
        {
            "decision": KIND,
            "model": cache.model_fingerprint(model),
            "element": repr(shapes),
            "hardware": hw.to_dict(),
            "processes": jax.process_count(),
            "devices": [str(d.device_kind) for d in jax.devices()],
            "plan": [
                plan.precision,
                plan.strategy,
                plan.replicas,
                plan.micro_batch_size,
                plan.global_batch_size,
            ],
            "limit": list(limit),
        }
    )


def _cached(
    key: str, search: SearchOptions | None
) -> tuple[int, sharding.Sharded | None] | None:
    """The decision cached under `key` (a compile per mesh saved: 20 s and
    more each on a GPU), unless the options refuse the cache."""
    if search is not None and (not search.cache or search.force):
        return None
    found = cache.cache_read(KIND, key)
    if found is None:
        return None
    try:
        request = found["sharded"]
        if request is None:
            return int(found["one"]), None
        return int(found["one"]), sharding.Sharded(
            tuple(request["mesh"]),
            {path: tuple(axes) for path, axes in request["layouts"].items()},
            f"{request['why']} (decided before, read from kerascale's cache)",
            int(request["bytes"]["replicated"]),
            int(request["bytes"]["sharded"]),
            dict(request["seconds_per_step"]),
        )
    except (KeyError, TypeError, ValueError):
        return None  # written by another version: decided again


def _as_json(one: int, request: sharding.Sharded | None) -> dict[str, Any]:
    field = None if request is None else {**request.as_plan_field(), "why": request.why}
    return {"one": one, "sharded": field}


def _sharded(
    model: Any,
    options: Options,
    planner: Planner,
    element: Any,
    one: int,
    room: DeviceRoom,
) -> sharding.Sharded:
    """The request for the mesh that fits `room` and trains fastest (`one`:
    one replica's bytes per device)."""
    import jax

    usable, source, search = room.usable, room.source, room.search
    variables = [
        sharding.VariableShape(v.path, tuple(v.shape), sharding.variable_bytes(v))
        for v in model.weights
    ]
    tried: list[sharding.Candidate] = []
    meshes = sharding.meshes(len(jax.devices()))
    # Timed where there is a choice, and only one process would time it.
    if jax.process_count() > 1:
        untimed_why = "not timed: each of several processes would time its own"
    elif len(meshes) == 1:
        untimed_why = "not timed: the only mesh of these devices"
    else:
        untimed_why = ""
    for mesh in meshes:
        split, whose = _model_layouts(model, mesh)
        if split is None:
            split, whose = sharding.layouts(variables, mesh[1]), "derived"
        if not split:
            continue
        request = sharding.Sharded(mesh, split, "", one)
        trial = dataclasses.replace(options, strategy=request)
        candidate = planner(trial)
        batch = candidate.micro_batch_size
        need, seconds, untimed = _measured(
            model,
            element,
            candidate,
            batch,
            None if untimed_why else usable,
            planner.hardware,
            search,
        )
        untimed = untimed_why or untimed
        tried.append(
            sharding.Candidate(
                mesh, split, whose, batch * mesh[0], need, seconds, untimed
            )
        )
    chosen, why_mesh = sharding.choose(tried, usable)
    if chosen is None:
        raise ConfigurationError(
            f"The model does not fit {source} ({format_bytes(usable)} per device, "
            f"less the margin) even split over every device: one replica needs "
            f"{format_bytes(one)}; split, "
            f"{sharding.describe(tried, usable) or 'no variable splits'}. "
            "Give more device_memory (or devices), or a smaller batch_size."
        )
    why = Reason(
        "sharding.split",
        one=format_bytes(one),
        source=source,
        usable=format_bytes(usable),
        variables=len(chosen.split),
        axis=chosen.mesh[1],
        whose=chosen.whose,
        need=format_bytes(chosen.need),
        mesh=why_mesh,
        tried=sharding.describe(tried, usable),
    )
    return sharding.Sharded(
        chosen.mesh, chosen.split, why, one, chosen.need, sharding.timings(tried)
    )


def _model_layouts(model: Any, mesh: tuple[int, int]) -> tuple[Any, str]:
    """The layouts a model brings for `mesh` (a keras-hub backbone's
    `get_layout_map`, its authors' choice, which wins over the derived one),
    resolved to its variables: ({path: axes}, whose); (None, "") without."""
    import jax
    import keras

    backbone = getattr(model, "backbone", model)
    layout_map_for = getattr(type(backbone), "get_layout_map", None)
    if not callable(layout_map_for):
        return None, ""
    batch, width = mesh
    device_mesh = keras.distribution.DeviceMesh(
        (batch, width),
        (sharding.BATCH_AXIS, sharding.MODEL_AXIS),
        jax.devices()[: batch * width],
    )
    try:
        layout_map = layout_map_for(device_mesh)
    except Exception:
        return None, ""  # not for this mesh: the derived layout instead
    out = {}
    for v in model.weights:
        layout = layout_map[v.path]
        if layout is not None:
            out[v.path] = tuple(layout.axes)
    return out, f"{type(backbone).__name__}.get_layout_map"


def _per_device(model: Any, element: Any, plan: Plan, batch: int) -> int:
    """What one device holds while `plan` trains a step of `batch` per
    replica: the state laid out there and the step's own buffers, by XLA's
    count (nothing runs; the model is put back)."""
    return _measured(model, element, plan, batch, None)[0]


def _measured(
    model: Any,
    element: Any,
    plan: Plan,
    batch: int,
    usable: int | None,
    hw: Hardware | None = None,
    search: SearchOptions | None = None,
) -> tuple[int, float | None, str]:
    """(`_per_device`'s bytes, the seconds of one real step or None, why it
    was not timed). Timed (with `usable`) where it fits `usable` and the
    memory free now: a copy of the state, which the steps consume, and the
    step's buffers on every device (on CPU devices, all in this process)."""
    import jax

    from kerascale.measure import request as request_lib
    from kerascale.measure.jax import device_free

    with Session() as session:
        trained, dist = session.model_for(model, plan)
        step = compiled.reported(compiled.StepMemory, "Building the train step")(
            trained, element, dist, plan.replicas
        )
        need = step.state_bytes + compiled.reported(step.need)(batch).need_bytes
        if usable is None or hw is None or need > usable:
            return need, None, "not timed"
        try:
            free, _ = device_free.free_bytes(hw, search or SearchOptions())
        except request_lib.SearchUnavailable as e:
            return need, None, f"not timed: {e}"
        on_host = hw.accelerator not in ("gpu", "tpu")
        taken = need * (jax.local_device_count() if on_host else 1)
        if taken > free:
            return need, None, f"not timed: {format_bytes(free)} free here"
        try:
            return need, step.seconds(trained, batch), ""
        except Exception as e:  # kerascale's own probe: the mesh is not timed
            return need, None, f"not timed: the step failed ({gist(e)})"


def _device_limit(hw: Hardware, search: SearchOptions | None) -> tuple[int | None, str]:
    """(bytes one device may hold, where the figure comes from): the
    `device_memory` you gave, else what a GPU or TPU reports; None on CPU
    devices without `device_memory`."""
    if search is not None and search.device_memory:
        return search.device_memory, "device_memory you passed"
    if hw.accelerator not in ("gpu", "tpu"):
        return None, ""
    import jax

    from kerascale.sense import jax_devices

    limit = jax_devices.memory_limit(jax.local_devices()[0])
    return limit, "XLA's allocator limit per device"
