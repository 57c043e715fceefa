"""Sizes users write ("6GiB") and sizes kerascale prints ("1.50 GiB")."""

from __future__ import annotations

import re
from typing import Any

from kerascale import _validation

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(name: str, value: Any) -> int:
    """Reads a memory size: an int of bytes, or a string like "6GiB", "512MB".

    Raises:
        ConfigurationError: Naming `name` and the value, for anything else
            (negative, zero, a bool, an unknown unit).
    """
    accepted = 'a positive number of bytes or a size like "6GiB" or "512MB"'
    if isinstance(value, bool):
        raise _validation.fail(name, value, accepted)
    if isinstance(value, int):
        if value <= 0:
            raise _validation.fail(name, value, accepted)
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            size = float(match.group(1)) * _UNITS[match.group(2).lower()]
            if size >= 1:
                return int(size)
    raise _validation.fail(name, value, accepted)


def format_bytes(n: float | None) -> str:
    """1536 * 2**20 -> "1.50 GiB"."""
    if n is None:
        return "?"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def dtype_bytes(dtype: Any) -> int:
    """The bytes of one element of `dtype` (a name, a NumPy or framework
    dtype): NumPy's itemsize, with bfloat16 and the float8 kinds from
    ml_dtypes (a Keras dependency), which NumPy does not know by name."""
    import numpy as np

    for each in (dtype, getattr(dtype, "name", None) or str(dtype)):
        try:
            return np.dtype(each).itemsize
        except TypeError:
            continue
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, each)).itemsize
