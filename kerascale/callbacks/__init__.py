"""Keras callbacks: each works inside a plain `model.fit` as well as through
`kerascale.fit`, which installs them from its arguments, and each leaves
nothing behind when `fit` raises (see `kerascale.callbacks._base`).

- `FaultTolerantBackup`: resume after a kill or preemption at the exact batch,
  with nothing applied twice and nothing lost.
- `Throughput`: samples/s, step time and ETA per epoch.
- `GPUMonitor`: utilisation, memory and power per GPU, through NVML.
- `TimeBudget`: stop before a deadline, leaving time for the last checkpoint.
- `ProfileWindow`: Keras's TensorBoard profiler for a window of steps, which
  also stops when `fit` raises.
- `Prefetch` (JAX): reads the next batches on a thread while the step runs.
- `NoiseScale`: the gradient noise scale at each epoch's end: whether a
  larger batch would pay.
- `ScaledLearningRate`: your learning rate scaled for a larger batch (SGD
  linearly with a warmup, the Adam family by the square root), put back at
  the end.
"""

from kerascale.callbacks.backup import PREEMPTED_EXIT_CODE, FaultTolerantBackup
from kerascale.callbacks.gpu_monitor import GPUMonitor
from kerascale.callbacks.learning_rate import ScaledLearningRate
from kerascale.callbacks.noise_scale import NoiseScale
from kerascale.callbacks.prefetch import Prefetch
from kerascale.callbacks.profile import ProfileWindow
from kerascale.callbacks.throughput import Throughput
from kerascale.callbacks.time_budget import TimeBudget

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "FaultTolerantBackup",
    "GPUMonitor",
    "NoiseScale",
    "Prefetch",
    "ProfileWindow",
    "ScaledLearningRate",
    "Throughput",
    "TimeBudget",
]
