"""Argument checks shared by every public entry point.

Messages follow Keras's rule: what was wrong, what is accepted, and the value
received, e.g. ``batch_size must be a positive int or "auto". Received:
batch_size=0``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from kerascale.errors import ConfigurationError


def fail(name: str, value: Any, accepted: str) -> ConfigurationError:
    """Builds the error for argument ``name`` that received ``value``."""
    return ConfigurationError(f"{name} must be {accepted}. Received: {name}={value!r}")


def positive_int(name: str, value: Any, *, accepted: str | None = None) -> int:
    """Returns ``value`` if it is an int >= 1; ``bool`` is rejected."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(name, value, accepted or "a positive int")
    return value


def int_at_least(name: str, value: Any, least: int) -> int:
    """Returns ``value`` if it is an int >= ``least``; ``bool`` is rejected."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise fail(name, value, f"an int >= {least}")
    return value


def fraction_below_one(name: str, value: Any) -> float:
    """Returns ``value`` if it is a number in [0, 1); ``bool`` is rejected."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value < 1
    ):
        raise fail(name, value, "a number in [0, 1)")
    return value


def one_of(name: str, value: Any, choices: Iterable[str]) -> str:
    """Returns ``value`` if it is one of the string ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise fail(name, value, f"one of {listed}")
    return value


def boolean(name: str, value: Any) -> bool:
    """Returns ``value`` if it is a real bool (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise fail(name, value, "True or False")
    return value


def boolean_or_auto(name: str, value: Any) -> bool | str:
    """Returns ``value`` if it is a real bool or "auto"."""
    if isinstance(value, str) and value == "auto":
        return value
    if not isinstance(value, bool):
        raise fail(name, value, 'True, False or "auto"')
    return value


_DURATION = re.compile(
    r"^(?=\d)(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<min>\d+(?:\.\d+)?)min)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?$"
)


def parse_duration(value: str) -> float | None:
    """Seconds in "90s", "10min", "18h" or "1h30min"; None if not such a string."""
    match = _DURATION.match(value.strip()) if isinstance(value, str) else None
    if not match or not any(match.groupdict().values()):
        return None
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return parts.get("h", 0) * 3600 + parts.get("min", 0) * 60 + parts.get("s", 0)


def duration(name: str, value: Any, *, accepted: str | None = None) -> float:
    """Returns seconds > 0 from a number of seconds or a string like "18h"."""
    accepted = accepted or (
        'a number of seconds > 0 or a string like "90s", "10min", "18h" or "1h30min"'
    )
    if isinstance(value, str):
        seconds = parse_duration(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = None
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise fail(name, value, accepted)
    return seconds
