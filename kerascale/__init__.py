"""kerascale: train an existing Keras 3 model at the scale of the hardware here.

Change one line: ``model.fit(ds)`` becomes ``kerascale.fit(model, ds)``.
"""

import logging

from kerascale import callbacks, data
from kerascale._version import __version__
from kerascale.apply.accumulation import accumulate
from kerascale.apply.strategy import connect_cluster
from kerascale.diagnose import Diagnosis, diagnose
from kerascale.errors import (
    BatchSizeSearchError,
    CheckpointError,
    ClusterConfigError,
    ConfigurationError,
    DataError,
    KerascaleError,
    KerascaleWarning,
    ModelError,
    UnsupportedError,
    WorkerLostError,
)
from kerascale.find_batch import find_batch_size
from kerascale.fit import fit, plan
from kerascale.measure.cache import clear as clear_cache
from kerascale.measure.result import BatchSearchResult
from kerascale.plan.data_changes import DataChanges
from kerascale.plan.plan import Plan
from kerascale.sense.hardware import (
    CPUInfo,
    GPUInfo,
    Hardware,
    TPUInfo,
    detect_hardware,
)

# What the user must know is a KerascaleWarning, shown by default; the
# "kerascale" logger carries debug detail only, where the application sends it.
logging.getLogger("kerascale").addHandler(logging.NullHandler())

# On a cluster of two or more workers (processes on JAX), join it now, before
# the script starts TensorFlow or JAX by building anything (see
# kerascale.apply.tensorflow.cluster.join_at_import and
# kerascale.apply.jax.cluster.join_at_import; KERASCALE_AUTO_CONNECT=0 turns
# it off). Elsewhere this does nothing.
from kerascale.apply.strategy import join_at_import as _join_at_import  # noqa: E402

_join_at_import()


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
    "DataChanges",
    "DataError",
    "Diagnosis",
    "GPUInfo",
    "Hardware",
    "KerascaleError",
    "KerascaleWarning",
    "ModelError",
    "Plan",
    "TPUInfo",
    "UnsupportedError",
    "WorkerLostError",
    "__version__",
    "accumulate",
    "callbacks",
    "clear_cache",
    "connect_cluster",
    "data",
    "detect_hardware",
    "diagnose",
    "find_batch_size",
    "fit",
    "plan",
    "tuner",
]
