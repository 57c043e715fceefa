"""The process's random state as a checkpoint records it, and why a tf.data
pipeline's order may not repeat: what the checkpoint's record of the run
(`_backup_meta`) and the input's position (`_input_position`,
`_input_source`, `_input_fingerprint`) share."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from kerascale.sense import data_facts


def random_state() -> dict[str, Any]:
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(keys), gauss],
        "numpy": [name, np_keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def restore_random_state(saved: dict[str, Any]) -> None:
    """Puts back Python's and NumPy's random state from `random_state()`'s
    record. Raises ValueError for a malformed record."""
    try:
        python_state = saved["python"]
        random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
        name, keys, pos, has_gauss, cached = saved["numpy"]
        np.random.set_state(
            (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
        )
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise ValueError(f"its random state is malformed ({e})") from None


def nondeterminism(dataset: Any) -> str | None:
    """Why a tf.data pipeline's order cannot be reproduced, or None."""
    if dataset is None:
        return None
    reasons = []
    try:
        if dataset.options().deterministic is False:
            reasons.append("its options allow non-deterministic order")
    except Exception:
        pass
    if data_facts.unseeded_shuffle(dataset):
        reasons.append("it shuffles without a seed (give shuffle() a seed)")

    reason = data_facts.stateful_reason(dataset)
    if reason:
        reasons.append(reason)
    return "; ".join(reasons) or None
