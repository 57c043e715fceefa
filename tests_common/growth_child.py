"""A run whose batch grows 32 -> 64 at epoch 2, checkpointed every 8 steps:
the child of the SIGKILL resume checks (growth_cases.check_a_sigkill_...).
The decision is scripted at its seam (`goodput.grow`, as `growth_cases.by_batch`
does): an uninterrupted run and a resumed one decide the same.

    python growth_child.py BACKEND CHECKPOINT_DIR OUT.npz
"""

import os
import sys

os.environ["KERAS_BACKEND"] = sys.argv[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import growth_cases


class _Patch:
    """What `growth_cases.by_batch` patches with pytest's monkeypatch."""

    setattr = staticmethod(setattr)


growth_cases.by_batch(_Patch(), {32: 64})
weights, batches, rate = growth_cases.grown_run(sys.argv[2])
np.savez(sys.argv[3], *weights, batch=np.array(batches), rate=np.array(rate))
