"""How kerascale's reports show themselves as a notebook cell's value.

A `Plan`, a batch search's result and a diagnosis print as a table
(`str`); as a cell's last line they showed their dataclass `repr`, a line of
hundreds of characters. `Table` makes them show the table there too:
IPython's pretty printer (a terminal IPython, Jupyter's text/plain) and
Jupyter's HTML (in <pre>, so the columns stay aligned). `repr` stays the
dataclass's own, a valid Python expression.
"""

from __future__ import annotations

import html
import textwrap
from typing import Any

WIDTH = 100  # columns of what kerascale prints: a terminal's, a notebook's


class Table:
    """Shows `str(self)` as a notebook cell's value."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # IPython's pretty printer walks the classes and takes the first
        # `_repr_pretty_` or `__repr__` one defines: a dataclass defines its
        # own `__repr__`, so the subclass must define `_repr_pretty_` too.
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = Table._repr_pretty_

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self) if cycle else str(self))

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"


def said(text: str) -> str:
    """`text` as kerascale prints it during a run (`kerascale: ...`): lines
    of at most `WIDTH` columns, the later ones indented under the first."""
    return textwrap.fill(
        text,
        WIDTH,
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
