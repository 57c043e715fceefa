"""The cache of measured decisions (batch searches, trials), and what keys it.

A measured decision is stored as JSON under `cache_dir()/<kind>/<key>.json`,
written atomically; the key holds the TensorFlow, Keras and kerascale
versions, so a decision does not outlive an upgrade. A cache that cannot be
read or written never stops training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from kerascale._version import __version__
from kerascale.errors import warn
from kerascale.measure.fingerprint import builder_fingerprint
from kerascale.sense import model_facts
from kerascale.sense.model_facts import is_builder

logger = logging.getLogger("kerascale")


def cache_dir() -> Path:
    """$KERASCALE_CACHE_DIR, else $XDG_CACHE_HOME/kerascale, else ~/.cache/kerascale."""
    if os.environ.get("KERASCALE_CACHE_DIR"):
        return Path(os.environ["KERASCALE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return Path(base) / "kerascale"


def cache_key(parts: dict[str, Any]) -> str:
    """A key for `parts`, with Keras's backend and the versions of it, Keras
    and kerascale added: a measured decision does not outlive an upgrade."""
    import importlib.metadata

    import keras

    backend = keras.backend.backend()
    try:
        engine = importlib.metadata.version(backend)
    except importlib.metadata.PackageNotFoundError:
        engine = ""
    versions = [engine, keras.__version__, __version__, backend]
    text = json.dumps({**parts, "versions": versions}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_read(kind: str, key: str) -> dict[str, Any] | None:
    """The cached entry `kind/key`, or None if absent or unreadable."""
    try:
        return json.loads((cache_dir() / kind / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


# Every kind of measurement kerascale caches, each a folder of the cache
# directory: `clear` removes these and nothing else (the directory may be one
# the user shares, $KERASCALE_CACHE_DIR). A kind not listed is refused.
# "first_trace" is no longer written (bf16's start on a CPU, weighed until
# the trials took the CPU's precision): kept, so `clear` removes what older
# versions left.
KINDS = ("batch_search", "trials", "first_trace", "jax-sharding-1")


def cache_write(kind: str, key: str, payload: dict[str, Any]) -> None:
    """Stores `payload` as `kind/key`, atomically; a cache that cannot be
    written is logged, never fatal (a read-only home must not stop training)."""
    if kind not in KINDS:
        raise ValueError(f"kerascale's cache has no kind {kind!r}; add it to KINDS")
    folder = cache_dir() / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, folder / f"{key}.json")
    except OSError as e:
        warn(f"kerascale's {kind} cache not written ({e}): measured again next time.")


def model_fingerprint(model: Any) -> str:
    """What identifies a model for the caches: its architecture and compile
    config with automatic names canonicalised (the learning rate left out:
    it moves no measurement); a builder's code, constants,
    defaults and closure values (`fingerprint.builder_fingerprint`)."""
    if is_builder(model):
        return builder_fingerprint(model)
    arch = model_facts.architecture(model)
    if arch is None:  # subclassed without get_config: its shapes stand in
        arch = type(model).__qualname__ + repr([tuple(w.shape) for w in model.weights])
    compiled = model_facts.compiled(model)
    return hashlib.sha256((arch + compiled).encode()).hexdigest()


def clear() -> int:
    """Removes every measurement kerascale cached, of every kind (`KINDS`:
    batch searches, trials, the reference step bf16 is weighed by, JAX's
    sharding decisions), and nothing else; returns how many. The next `fit`
    measures again."""
    removed = 0
    for kind in KINDS:
        folder = cache_dir() / kind
        for entry in folder.glob("*.json") if folder.is_dir() else ():
            entry.unlink(missing_ok=True)
            removed += 1
    return removed
