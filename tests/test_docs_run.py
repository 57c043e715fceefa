"""Every Python sample in README.md and docs/ runs (issue 41: the guides
cannot drift from what the code does). A sample trains on the reader's
objects (`model`, `train_ds`, `build_model()`...) and places (`/ckpt`,
`gs://bucket`): here they are small stand-ins, and the places are a
temporary folder. The substitutions are listed, so a reader can see that
nothing else of a sample changes."""

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_docs_code import PAGES, ROOT, pages

import kerascale

# The reader's places and sizes -> this test's (`{tmp}`: a new folder).
SUBSTITUTIONS = [
    (r'"/ckpt"', '"{tmp}/ckpt"'),
    (r'"gs://bucket/run1"', '"{tmp}/run1"'),
    (r'"/data/kerascale-shards"', '"{tmp}/shards"'),
    (r'"images/\*\.jpg"', '"{tmp}/images/*.jpg"'),
    (r'log_dir="logs"', 'log_dir="{tmp}/logs"'),
    (r'directory="tuning"', 'directory="{tmp}/tuning"'),
    (r'"model\.keras"', '"{tmp}/model.keras"'),
    (r'"batch\.png"', '"{tmp}/batch.png"'),
    (r"\bepochs=\d+", "epochs=2"),
    (r"max_trials=\d+", "max_trials=1"),
    (r"batch_size=\(32, 16384\)", "batch_size=(32, 64)"),
    # 4 GiB: the limit counts this process's resident memory, which a test
    # worker has grown by the files it ran before (2 GiB was at its edge).
    (r'memory_limit="[26]GiB"', 'memory_limit="4GiB"'),
    # BayesianOptimization needs keras-tuner[bayesian] (scikit-learn), which
    # the test environment leaves out; the sample's kerascale part is the same.
    (r"keras_tuner\.BayesianOptimization", "keras_tuner.RandomSearch"),
]
SAMPLES = 256  # the stand-in data's size


def build_model(hp=None):
    """The reader's model: a small compiled conv net on 16x16x3 images."""
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _names(tmp: Path) -> dict:
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 16, 16, 3), dtype="float32")
    y = rng.integers(0, 4, SAMPLES).astype("int32")
    images = tmp / "images"
    images.mkdir()
    for i in range(8):
        pixels = tf.constant(rng.integers(0, 255, (16, 16, 3)), tf.uint8)
        tf.io.write_file(str(images / f"{i}.jpg"), tf.io.encode_jpeg(pixels))

    def decode(path):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.cast(image, tf.float32) / 255.0, tf.constant(0, tf.int32)

    def augment(image, label):
        return tf.image.random_flip_left_right(image), label

    samples_ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = samples_ds.batch(32)
    return {
        "keras": keras,
        "tf": tf,
        "kerascale": kerascale,
        "model": build_model(),
        "build_model": build_model,
        "build_my_model": build_model,
        "x": x,
        "y": y,
        "x_train": x,
        "y_train": y,
        "ds": ds,
        "train_ds": ds,
        "val_ds": ds.take(2),
        "decode": decode,
        "augment": augment,
        "samples_ds": samples_ds,
    }


# Where a page's `ds` is a dataset of samples (it batches it itself).
UNBATCHED = ("docs/accumulation.md", "docs/checkpointing.md")
RUN = [p for p in PAGES if any(True for _ in pages().parse(p).examples())]


@pytest.mark.parametrize("page", RUN, ids=[str(p.relative_to(ROOT)) for p in RUN])
def test_each_page_runs_as_a_reader_runs_it(page, tmp_path, monkeypatch, capsys):
    """The page's Python blocks, top to bottom in one namespace, through
    Sybil (its parser finds them, its document evaluates them in order, and
    `<!-- skip: next -->` before a block keeps it from running), on the
    stand-ins above with the listed substitutions."""
    monkeypatch.setenv("KERASCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # whatever else a sample writes lands here
    ran = []

    def evaluate(example):
        code = example.parsed
        for pattern, replacement in SUBSTITUTIONS:
            code = re.sub(pattern, replacement.format(tmp=tmp_path), code)
        where = f"{page.relative_to(ROOT)}, line {example.line}"
        exec(compile(code, where, "exec"), example.namespace)
        ran.append(code)

    document = pages(evaluate).parse(page)
    document.namespace.update(_names(tmp_path))
    if str(page.relative_to(ROOT)) in UNBATCHED:
        document.namespace["ds"] = document.namespace["samples_ds"]
    policy = keras.config.dtype_policy()
    try:
        for example in document.examples():
            example.evaluate()
    finally:  # the tour's sample sets the global policy, as a reader would
        keras.config.set_dtype_policy(policy)
    assert ran, f"{page}: no block ran"
    if any("print(" in code for code in ran):  # what it prints: a plan, a result
        printed = capsys.readouterr().out
        assert re.search(r"kerascale plan|batch|bound", printed), printed[-2000:]
