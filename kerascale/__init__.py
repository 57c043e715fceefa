"""kerascale: train an existing Keras 3 model at the scale of the hardware here.

Change one line: ``model.fit(ds)`` becomes ``kerascale.fit(model, ds)``.
"""

import logging

from kerascale import callbacks, data
from kerascale.accumulation import accumulate
from kerascale.batch_search import BatchSearchResult, find_batch_size
from kerascale.diagnosis import Diagnosis, diagnose
from kerascale.errors import (
    BatchSizeSearchError,
    CheckpointError,
    ClusterConfigError,
    ConfigurationError,
    DataError,
    KerascaleError,
    ModelError,
    UnsupportedError,
    WorkerLostError,
)
from kerascale.fit import fit, plan
from kerascale.hardware import CPUInfo, GPUInfo, Hardware, TPUInfo, detect_hardware
from kerascale.multiworker import connect as connect_cluster
from kerascale.planning import Plan

__version__ = "0.1.0"

# A library logs; the application decides where logs go. Without this, Python's
# last-resort handler would print kerascale's warnings to stderr even with
# verbose=0 (the plan table shows them when verbose is on).
logging.getLogger("kerascale").addHandler(logging.NullHandler())


def __getattr__(name: str):
    # kerascale.tuner needs the optional keras-tuner: imported on first use.
    if name == "tuner":
        import importlib

        return importlib.import_module("kerascale.tuner")
    raise AttributeError(f"module 'kerascale' has no attribute {name!r}")


__all__ = [
    "BatchSearchResult",
    "BatchSizeSearchError",
    "CPUInfo",
    "CheckpointError",
    "ClusterConfigError",
    "ConfigurationError",
    "DataError",
    "Diagnosis",
    "GPUInfo",
    "Hardware",
    "KerascaleError",
    "ModelError",
    "Plan",
    "TPUInfo",
    "UnsupportedError",
    "WorkerLostError",
    "__version__",
    "accumulate",
    "callbacks",
    "connect_cluster",
    "data",
    "detect_hardware",
    "diagnose",
    "find_batch_size",
    "fit",
    "plan",
    "tuner",
]
