"""The shape of a subpackage: its modules, lines and import depth.

Depth is the longest chain of imports among the subpackage's own modules
(module-level and function-level imports alike, as archcheck reads cycles):
how many modules one must read through to reach the bottom. Issue 57 tracks
`kerascale/measure` with it:

    python3 benchmarks/package_shape.py kerascale/measure
"""

from __future__ import annotations

import ast
import functools
import pathlib
import sys


def shape(root: pathlib.Path) -> tuple[int, int, int]:
    """(modules, lines, depth) of the package at `root`."""
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            edges[name] |= {n for n in names if n in modules and n != name}

    @functools.cache
    def depth(name: str) -> int:
        return 1 + max((depth(n) for n in edges[name]), default=0)

    lines = sum(len(p.read_text().splitlines()) for p in modules.values())
    return len(modules), lines, max(map(depth, modules), default=0)


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "kerascale/measure")
    count, lines, deep = shape(root)
    print(f"{root}: {count} modules, {lines} lines, import depth {deep}")
