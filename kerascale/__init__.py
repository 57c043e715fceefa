"""kerascale: train an existing Keras 3 model at the scale of the hardware here.

Change one line: ``model.fit(ds)`` becomes ``kerascale.fit(model, ds)``.
"""

from kerascale.errors import (
    ClusterConfigError,
    ConfigurationError,
    DataError,
    KerascaleError,
    ModelError,
    UnsupportedError,
)
from kerascale.fit import fit, plan
from kerascale.hardware import CPUInfo, GPUInfo, Hardware, TPUInfo, detect_hardware
from kerascale.planning import Plan

__version__ = "0.1.0"

__all__ = [
    "CPUInfo",
    "ClusterConfigError",
    "ConfigurationError",
    "DataError",
    "GPUInfo",
    "Hardware",
    "KerascaleError",
    "ModelError",
    "Plan",
    "TPUInfo",
    "UnsupportedError",
    "__version__",
    "detect_hardware",
    "fit",
    "plan",
]
