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
from typing import Any


class Table:
    """Shows `str(self)` as a notebook cell's value."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self) if cycle else str(self))

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"
