"""`kerascale.data`: the input-pipeline changes `kerascale.fit` makes, on their
own, for a plain `model.fit`.

- `optimize(ds)`: parallel maps (random augmentations and Python functions
  included), TensorFlow's map parallelisation, a safe `cache()`, and
  `prefetch`, keeping the order of elements.
- `optimize_report(ds)`: what `optimize` would change, in words.
"""

from kerascale.apply.data import optimize, optimize_report

__all__ = ["optimize", "optimize_report"]
