"""The guides' Python samples against the API they show: every sample in
README.md and docs/ parses, and every call it makes to kerascale names a
function or class that exists, with arguments its signature takes (issue
41: samples drift from the code as it changes; a renamed argument must
break this test, not a reader's script). test_docs_run.py runs them, on
stand-ins for the reader's data (`train_ds`, `build_model()`)."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import keras
import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def pages(evaluator=None) -> Sybil:
    """Sybil's reader of the pages: their ```python blocks (evaluated by
    `evaluator`), and `<!-- skip: next -->` before a block not meant to run."""
    return Sybil(parsers=[SkipParser(), CodeBlockParser("python", evaluator)])


def samples():
    """Each page's Python blocks, as Sybil parses them."""
    for page in PAGES:
        blocks = [e for e in pages().parse(page).examples() if _is_code(e)]
        for i, example in enumerate(blocks):
            yield pytest.param(example.parsed, id=f"{page.relative_to(ROOT)}[{i}]")


def _is_code(example) -> bool:
    return isinstance(example.parsed, str)


def _kerascale_names(tree: ast.Module) -> dict[str, object]:
    """Names a sample binds to kerascale's objects: `kerascale` itself
    (always, as README's samples assume it imported) and its imports."""
    names: dict[str, object] = {"kerascale": importlib.import_module("kerascale")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "kerascale"
        ):
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


def _resolve(func: ast.expr, names: dict[str, object]):
    """The kerascale object a call's target names, or None (not kerascale's)."""
    chain = []
    while isinstance(func, ast.Attribute):
        chain.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in names:
        return None
    obj = names[func.id]
    for attr in reversed(chain):
        if inspect.ismodule(obj) and not hasattr(obj, attr):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{attr}")
            except ModuleNotFoundError:
                raise AttributeError(f"{obj.__name__} has no {attr!r}") from None
        else:
            obj = getattr(obj, attr)  # AttributeError: the name does not exist
    return obj


def calls(code: str) -> list[tuple[str, object, ast.Call]]:
    tree = ast.parse(code)
    names = _kerascale_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            obj = _resolve(node.func, names)
            if obj is not None and callable(obj):
                found.append((ast.unparse(node.func), obj, node))
    return found


@pytest.mark.parametrize("code", list(samples()))
def test_each_sample_calls_kerascale_as_its_signatures_allow(code):
    for _, obj, node in calls(code):
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            continue  # *args or **kwargs: nothing to check by name
        args = [None] * len(node.args)
        kwargs = {k.arg: None for k in node.keywords}
        try:
            bound = inspect.signature(obj).bind(*args, **kwargs)
            # What kerascale passes on to Keras's own fit, Keras's fit takes.
            rest = bound.arguments.get("fit_kwargs", {})
            inspect.signature(keras.Model.fit).bind(None, **rest)
        except TypeError as e:
            raise AssertionError(f"{ast.unparse(node)}: {e}") from None


def test_the_samples_reach_the_public_api():
    """The check above has something to check: the samples call fit, the
    search, plan, diagnose, accumulate, materialize, the callbacks and the
    tuner's hypermodel."""
    reached = {
        getattr(obj, "__qualname__", "")
        for p in samples()
        for _, obj, _ in calls(p.values[0])
    }
    assert {
        "fit",
        "find_batch_size",
        "plan",
        "diagnose",
        "accumulate",
        "materialize",
        "FaultTolerantBackup",
        "Throughput",
        "TimeBudget",
        "ScaledHyperModel",
    } <= reached, reached


def test_a_renamed_argument_fails_the_check():
    """The check can fail: `force` is find_batch_size's, not fit's."""
    code = "kerascale.fit(model, x, force=True)\n"
    with pytest.raises(AssertionError, match="force"):
        test_each_sample_calls_kerascale_as_its_signatures_allow(code)
    with pytest.raises(AttributeError):
        calls("kerascale.find_batch_sizes(model, x)\n")


def test_the_design_walk_names_what_exists():
    """Every `package.module.name` the walk of one `fit` call names is in
    kerascale: a rename must break this test, not the walk."""
    walk = (ROOT / "docs" / "design" / "walk.md").read_text(encoding="utf-8")
    packages = ("apply.", "callbacks.", "measure.", "plan.", "sense.")
    dotted = re.findall(r"`([a-z_]+(?:\.[A-Za-z_]+)+)`", walk)
    names = sorted({n for n in dotted if n.startswith(packages)})
    assert len(names) > 20
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module
            try:
                found = importlib.import_module("kerascale." + ".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(found, attr), f"walk.md names {name}: no {attr}"
                found = getattr(found, attr)
            break
        else:
            raise AssertionError(f"walk.md names {name}: no such module")
