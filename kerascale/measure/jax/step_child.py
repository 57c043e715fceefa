"""One real training step in a fresh JAX process, for the batch search's
confirmation on a CPU (`confirm.real_need`): what the compiler does not see
(a convolution's scratch memory outside XLA's buffers, the host's copies)
shows in the process's peak resident memory.

Its design: docs/design/modules.md, `kerascale.measure.jax.step_child`.
"""

from __future__ import annotations

import json
import os
import sys

# Marks a leaf of SPEC (encode_spec), which may hold dicts of inputs too.
LEAF = "__kerascale_leaf__"


def main(
    path: str,
    spec_path: str,
    policy: str,
    batch: str,
    replicas: str = "1",
    recompute: str = "",
) -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import numpy as np

    from kerascale._keras_compat.serialization import tensorflow_left_unimported
    from kerascale.apply import precision, remat
    from kerascale.sense import memory

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    n = int(replicas)
    if n > 1:
        import jax

        devices = jax.devices()
        if len(devices) < n:
            raise SystemExit(f"{n} replicas asked, {len(devices)} devices here")
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices[:n])
        )
    with tensorflow_left_unimported():
        model = keras.models.load_model(path)
    precision.apply(model, policy)
    if recompute:
        remat.apply(model, recompute)

    def zeros(node: object, n: int) -> object:
        if isinstance(node, dict) and LEAF in node:
            return np.zeros((n, *node["shape"]), node["dtype"])
        if isinstance(node, dict):
            return {k: zeros(v, n) for k, v in node.items()}
        return [zeros(v, n) for v in node]

    model.train_on_batch(*zeros(spec, n))
    # Two steps of Keras's own fit on arrays, as the user's fit trains: its
    # batches gathered on the host and the next one read while a step runs
    # (a lone train_on_batch took up to 3% less than a fit at one batch).
    global_batch = int(batch) * n
    data = zeros(spec, 2 * global_batch)
    # The parent's budget is read with its freed heap released: so is this
    # baseline, or the step would reuse the first step's freed pages unseen.
    memory.release_freed()
    before = memory.resident_bytes()
    if not memory.reset_resident_peak():
        raise SystemExit("cannot reset the resident peak here")
    model.fit(*data, batch_size=global_batch, epochs=1, steps_per_epoch=2, verbose=0)
    print(json.dumps({"need": memory.resident_peak_bytes() - before}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])


def encode_spec(element: object) -> object:
    """`element` ((x, y) of leaves with `.shape` and `.dtype`) as JSON."""
    if hasattr(element, "shape") and hasattr(element, "dtype"):
        import numpy as np

        return {
            LEAF: 1,
            "shape": list(element.shape),
            "dtype": np.dtype(element.dtype).name,
        }
    if isinstance(element, dict):
        return {k: encode_spec(v) for k, v in element.items()}
    return [encode_spec(v) for v in element]
