"""`kerascale.data`: the input-pipeline changes `kerascale.fit` makes, on their
own, for a plain `model.fit`.

- `optimize(ds)`: parallel maps (random augmentations and Python functions
  included), TensorFlow's map parallelisation, a safe `cache()`, and
  `prefetch`, keeping the order of elements.
- `optimize_report(ds)`: what `optimize` would change, in words.
- `materialize(ds, directory)`: the deterministic part of the pipeline
  (decoding, parsing) run once and kept as shards, read back in parallel
  every epoch after, with the random part applied on reading.
"""

from kerascale.apply.data import optimize, optimize_report
from kerascale.apply.materialize import materialize, materialized

__all__ = ["materialize", "materialized", "optimize", "optimize_report"]
