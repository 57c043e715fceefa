"""The backend seam holds: outside the one dispatch module per floor, no
stage compares the backend's name; it reads `sense.backend.traits`."""

import re
from pathlib import Path

import kerascale
from kerascale.sense import backend as backend_lib

PACKAGE = Path(kerascale.__file__).parent

# The one place per floor that picks a backend's module (see
# sense/backend.py's docstring), and Keras's own choice that keras_compat
# mirrors (the strategy an optimizer's accumulators are made in).
DISPATCH = {
    "sense/backend.py",
    "sense/hardware.py",
    "plan/strategy/__init__.py",
    "measure/engines.py",
    "apply/strategy.py",
    "_keras_compat/__init__.py",
    "callbacks/profile.py",
    "callbacks/_backup_state.py",
    "callbacks/prefetch.py",
}
NAMES = r"\"(?:tensorflow|jax|torch|numpy|openvino)\""
COMPARISON = re.compile(rf"(?:[=!]=\s*{NAMES}|{NAMES}\s*[=!]=|in\s*\({NAMES})")


def test_only_the_dispatch_modules_compare_backend_names():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in DISPATCH:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "backend names compared outside the seam:\n" + "\n".join(found)


def test_the_pattern_catches_a_comparison():
    # The scan above would pass vacuously if the pattern matched nothing.
    assert COMPARISON.search('    if plan.backend == "jax":')
    assert COMPARISON.search('    if keras.backend.backend() != "tensorflow":')
    assert not COMPARISON.search('    SUPPORTED = ("tensorflow", "jax")')


def test_every_supported_backend_has_its_traits_and_others_have_none_of_its_powers():
    for name in backend_lib.SUPPORTED:
        assert backend_lib.traits(name).name == name
    torch = backend_lib.traits("torch")
    assert torch.name == "torch" and torch.engine == "nothing"
    assert not torch.joins_tf_clusters and not torch.reads_in_step_thread
    assert backend_lib.traits("tensorflow").joins_tf_clusters
    assert not backend_lib.traits("jax").joins_tf_clusters
