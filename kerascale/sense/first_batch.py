"""A generator's first batch, read at `kerascale.fit`'s door to learn its
size and kind, and given back first: the elements, their order and the
generator's own side effects are Keras's, only the first comes a moment
earlier (Keras reads one too before training, to build the model)."""

from __future__ import annotations

import inspect
import weakref
from typing import Any

# A generator's first element, read by `first_read`, keyed by the generator
# that yields it again.
_FIRST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def first_read(x: Any) -> Any:
    """`x`, or for a generator one that yields the same elements, whose first
    was read here to learn its batch."""
    if not inspect.isgenerator(x) or x in _FIRST:
        return x
    try:
        first = next(x)
    except StopIteration:
        return x  # empty: Keras says so
    except Exception:
        return x  # the generator's own error: Keras raises it when it reads

    def again() -> Any:
        yield first
        yield from x

    chained = again()
    _FIRST[chained] = first
    return chained


def first_of(x: Any) -> Any:
    """The first batch `first_read` read of `x`, or None."""
    return _FIRST.get(x) if inspect.isgenerator(x) else None
