"""keras-hub task models through `kerascale.fit` (issue 25): a text
classifier with its preprocessor on a Python list of strings, a causal LM on
strings, and an image classifier on arrays, each built from a config
without downloading weights. Each stays its own class with its
preprocessor, trains with bf16 set in place (outputs float32), and ends with
its own policies back; the image classifier's arrays also get the batch
search, and a checkpoint directory resumes."""

import warnings

import keras
import numpy as np
from conftest import keras_hub_or_skip

import kerascale

keras_hub = keras_hub_or_skip()

TEXTS = ["the movie was great", "a bad film", "great fun", "awful and bad"] * 8
LABELS = [1, 0, 1, 0] * 8
WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "movie",
    "was",
    "great",
    "a",
    "bad",
    "film",
    "fun",
    "awful",
    "and",
]


def text_classifier():
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=WORDS)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=8
    )
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(WORDS),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=8,
    )
    return keras_hub.models.BertTextClassifier(
        backbone, num_classes=2, preprocessor=preprocessor
    )


def causal_lm():
    # Byte-level characters of the texts, and two merges ("Ġ" is a space).
    merges = ["a i", "ai r"]
    tokens = ["<|endoftext|>", "Ġ", *"airplnetoc", "ai", "air"]
    vocabulary = {token: i for i, token in enumerate(tokens)}
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(
        tokenizer, sequence_length=8
    )
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=8,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)


def image_classifier():
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64],
        stackwise_num_blocks=[1],
        stackwise_num_strides=[1],
        block_type="basic_block",
        image_shape=(16, 16, 3),
    )
    model = keras_hub.models.ImageClassifier(backbone, num_classes=3)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def seen_during(model):
    """A callback noting, at the first batch, the dtypes the model ran with."""
    seen = {}

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not seen:
                seen["policies"] = {
                    layer.dtype_policy.name for layer in model.backbone.layers
                }
                seen["optimizer"] = model.optimizer

    return seen, Peek()


def trains_in_bf16(model, x, y=None, **kwargs):
    cls, preprocessor = type(model), getattr(model, "preprocessor", None)
    optimizer = model.optimizer
    seen, peek = seen_during(model)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        history = kerascale.fit(
            model,
            x,
            y,
            precision="mixed_bfloat16",
            verbose=0,
            callbacks=[peek],
            **kwargs,
        )
    said = [str(w.message) for w in said if w.category is kerascale.KerascaleWarning]
    assert history.plan.precision == "mixed_bfloat16" and not history.plan.rebuild
    assert "mixed_bfloat16" in seen["policies"]  # bf16 while training
    assert seen["optimizer"] is optimizer
    assert type(model) is cls and model.preprocessor is preprocessor
    assert {layer.dtype_policy.name for layer in model.backbone.layers} == {"float32"}
    assert np.isfinite(history.history["loss"][-1])
    assert not [w for w in said if "failed at the first" in w or "Not applied" in w]
    return history, said


def test_a_text_classifier_with_its_preprocessor_trains_on_a_list_of_strings():
    model = text_classifier()
    _, said = trains_in_bf16(model, TEXTS, LABELS, batch_size=8, epochs=2)
    assert any("passes your data to Keras" in w for w in said)
    # The task's own predict, with its preprocessor, still takes strings.
    out = model.predict(["great fun"], verbose=0)
    assert out.shape == (1, 2) and out.dtype == np.float32


def test_a_causal_lm_trains_on_strings():
    model = causal_lm()
    weights = len(model.weights)
    trains_in_bf16(model, [" airplane at airport", " airport"] * 16, batch_size=8)
    assert len(model.weights) == weights


def test_an_image_classifier_gets_the_batch_search_and_checkpoints(tmp_path, no_budget):
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(64, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 3, 64)
    model = image_classifier()
    history, _ = trains_in_bf16(
        model,
        x,
        y,
        epochs=2,
        checkpoint_dir=str(tmp_path / "ckpt"),
        max_batch_size=32,
    )
    assert history.plan.reasons["global_batch_size"].code == "batch.searched"
    assert history.plan.global_batch_size <= 32
    assert (tmp_path / "ckpt").exists() and any((tmp_path / "ckpt").iterdir())
