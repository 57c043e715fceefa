"""A pipeline for tests/test_materialize.py's kill test, in a module both
the test and its child process import (the same functions, so the same
fingerprint).

    python materialize_child.py DIRECTORY

materializes `pipeline()` into DIRECTORY, slowly (each element takes
`DELAY` seconds to make), and prints the record's JSON.
"""

import json
import sys
import time

import numpy as np
import tensorflow as tf

N, DELAY = 120, 0.03


def _slow(i):
    time.sleep(DELAY)
    return np.full((64,), i, np.float32)


def make(i):
    x = tf.numpy_function(_slow, [i], tf.float32)
    return tf.ensure_shape(x, (64,)), i % 3


def pipeline():
    return tf.data.Dataset.range(N).map(make)


def then(ds):
    return ds.batch(8)


if __name__ == "__main__":
    from kerascale.data import materialized

    done = materialized(pipeline(), sys.argv[1], then=then)
    print(json.dumps({"reused": done.reused, "elements": done.elements}), flush=True)
