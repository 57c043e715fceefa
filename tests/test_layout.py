"""The package's shape: imports point one way down the pipeline (sense -> plan
-> apply -> callbacks -> measure, front doors on top), function-
level imports included, and no module reaches into another's private names.
Read from the source with `ast`; nothing is imported."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "kerascale"
SHARED = {"kerascale._validation", "kerascale._units", "kerascale._version"}
SHARED |= {"kerascale._state"}
SHARED |= {"kerascale.errors", "kerascale._tf_compat", "kerascale._tf", "kerascale._fs"}
SHARED |= {"kerascale._jax_compat"}  # the one module of JAX's private names
# the one package of Keras's private names, beside TensorFlow's and JAX's
SHARED |= {
    f"kerascale._keras_compat{part}"
    for part in (
        "",
        ".distributed_accumulation",
        ".generator_feed",
        ".jax_variables",
        ".serialization",
        ".epoch_order",
        ".adapter_reads",
        ".trainers",
        ".status",
    )
}
SHARED |= {"kerascale._pids"}  # whether a process is alive
SHARED |= {"kerascale._display"}  # how a report shows itself in a notebook
# Each stage may import itself and the stages listed.
ALLOWED = {
    "shared": {"shared"},
    "sense": {"shared", "sense"},
    "plan": {"shared", "sense", "plan"},
    "apply": {"shared", "sense", "plan", "apply"},
    # A search's answer hands on the callback its batch needs
    # (`BatchSearchResult.fit_kwargs`: `ScaledLearningRate`).
    "measure": {"shared", "sense", "plan", "apply", "callbacks", "measure"},
    "callbacks": {"shared", "sense", "plan", "apply", "callbacks"},
}


def modules():
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def stage(module):
    if module in SHARED:
        return "shared"
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in ALLOWED:
        return parts[1]
    return "door"


def resolve(name, known):
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(tree, known):
    """(module imported, name imported from it or None) for every kerascale
    import, wherever it is in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "kerascale"
        ):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    yield full, None
                else:
                    yield resolve(node.module, known), alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kerascale"):
                    yield resolve(alias.name, known), None


def test_imports_point_down_the_pipeline():
    known = modules()
    wrong = []
    for name, path in known.items():
        here = stage(name)
        if here == "door":
            continue
        for target, _ in imported(ast.parse(path.read_text()), known):
            if target and stage(target) not in ALLOWED[here]:
                wrong.append(f"{name} ({here}) imports {target} ({stage(target)})")
    assert wrong == []
    # The check sees what it must: every stage has modules.
    assert {stage(n) for n in known} == {*ALLOWED, "door"}


def private_uses(name, tree, known):
    """Where module `name` reaches into another kerascale module's private
    names: `from m import _x`, or `m._x` on an imported module `m`."""
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "kerascale"
        ):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    aliases[alias.asname or alias.name] = full
                elif _private(alias.name):
                    found.append(f"{name} imports {full}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kerascale") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            found.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_reaches_into_another_modules_private_names():
    known = modules()
    wrong = []
    for name, path in known.items():
        wrong += private_uses(name, ast.parse(path.read_text()), known)
    assert wrong == []


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def test_the_checks_catch_what_they_look_for():
    """Both rules fail on made-up violations, so they can fail at all."""
    source = (
        "from kerascale.measure import cache\n"
        "from kerascale.measure.cache import _secret\n"
        "def f():\n"
        "    return cache._hidden\n"
    )
    tree = ast.parse(source)
    known = {"kerascale.measure", "kerascale.measure.cache"}
    assert stage("kerascale.measure.cache") not in ALLOWED["sense"]
    assert "kerascale.measure.cache" in [t for t, _ in imported(tree, known)]
    assert private_uses("kerascale.sense.x", tree, known) == [
        "kerascale.sense.x imports kerascale.measure.cache._secret",
        "kerascale.sense.x uses kerascale.measure.cache._hidden",
    ]
