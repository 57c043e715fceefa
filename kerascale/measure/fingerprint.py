"""What identifies a model builder for the caches: its code, not its name.

Its design: docs/design/modules.md, `kerascale.measure.fingerprint`.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
import types
from typing import Any

import numpy as np

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 6
_ARRAY_BYTES = 16 << 20
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def builder_fingerprint(builder: Any) -> str:
    """A stable hash of what `builder` builds (see the module doc)."""
    text = json.dumps(_describe(builder, 0, set()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _describe(obj: Any, depth: int, seen: set[int]) -> Any:
    if isinstance(obj, _PLAIN):
        return [type(obj).__name__, repr(obj)]
    if depth > _MAX_DEPTH or id(obj) in seen:
        return ["...", type(obj).__qualname__]
    seen = seen | {id(obj)}
    d = depth + 1
    if isinstance(obj, list | tuple | set | frozenset):
        items = [_describe(v, d, seen) for v in obj]
        return [
            type(obj).__name__,
            sorted(items, key=str) if isinstance(obj, set | frozenset) else items,
        ]
    if isinstance(obj, dict):
        return ["dict", sorted([str(k), _describe(v, d, seen)] for k, v in obj.items())]
    if isinstance(obj, np.ndarray):
        return _array(obj)
    if isinstance(obj, functools.partial):
        parts = (obj.func, obj.args, obj.keywords)
        return ["partial", *(_describe(p, d, seen) for p in parts)]
    if isinstance(obj, types.MethodType):
        return [
            "method",
            _describe(obj.__func__, d, seen),
            _describe(obj.__self__, d, seen),
        ]
    if isinstance(obj, types.FunctionType):
        return _function(obj, d, seen)
    if isinstance(obj, types.ModuleType):
        return ["module", obj.__name__]
    if inspect.isclass(obj):
        return ["class", obj.__module__, obj.__qualname__]
    config = _keras_config(obj)
    if config is not None:
        return ["keras", type(obj).__qualname__, config]
    if callable(obj) and hasattr(obj, "__dict__"):
        call = _describe(type(obj).__call__, d, seen)
        return ["callable", type(obj).__qualname__, call, _describe(vars(obj), d, seen)]
    return ["object", type(obj).__qualname__, _ADDRESS.sub("", repr(obj))[:200]]


def _function(fn: types.FunctionType, depth: int, seen: set[int]) -> Any:
    code = fn.__code__
    closure = [_describe(_cell(cell), depth, seen) for cell in (fn.__closure__ or ())]
    return [
        "function",
        fn.__module__,
        fn.__qualname__,
        _code(code),
        _describe(fn.__defaults__, depth, seen),
        _describe(fn.__kwdefaults__, depth, seen),
        closure,
        _globals_read(fn, code, depth, seen),
    ]


def _code(code: types.CodeType) -> Any:
    consts = [
        _code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts
    ]
    return [code.co_code.hex(), consts, list(code.co_names), code.co_argcount]


def _globals_read(
    fn: types.FunctionType, code: types.CodeType, depth: int, seen
) -> Any:
    """The module-level values the function reads by name: plain values and
    the user's own functions (library code does not change between runs)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= set(const.co_names)
    out = []
    for name in sorted(names):
        value = fn.__globals__.get(name)
        if isinstance(value, _PLAIN) or (
            isinstance(value, types.FunctionType) and value.__module__ == fn.__module__
        ):
            out.append([name, _describe(value, depth, seen)])
    return out


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later)
        return None


def _array(a: np.ndarray) -> Any:
    if a.nbytes > _ARRAY_BYTES:
        sample = a.reshape(-1)[:: max(1, a.size // 4096)]
        content = hashlib.sha256(np.ascontiguousarray(sample).tobytes()).hexdigest()
    else:
        content = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    return ["ndarray", list(a.shape), str(a.dtype), content]


def _keras_config(obj: Any) -> Any:
    """A Keras object's config (a layer, loss, optimizer...), or None."""
    get_config = getattr(obj, "get_config", None)
    if get_config is None or not type(obj).__module__.startswith(("keras", "tf_keras")):
        return None
    try:
        return json.dumps(get_config(), sort_keys=True, default=str)
    except Exception:
        return None
