"""Where this Keras keeps its backend trainer classes.

Keras 3.16 (keras-nightly 3.16.0.dev2026102704) renamed each backend's
trainer class to `Trainer` in its module (`TensorFlowTrainer` and
`JAXTrainer` up to 3.15); the multi-worker fix patches the TensorFlow one.
`tests/test_compat.py` fails when neither name is there.
"""

from __future__ import annotations


def tf_trainer_class() -> type:
    """Keras's TensorFlow trainer class, under either name."""
    from keras.src.backend.tensorflow import trainer

    found = getattr(trainer, "TensorFlowTrainer", None) or getattr(
        trainer, "Trainer", None
    )
    if not isinstance(found, type):
        raise ImportError(
            "Keras's TensorFlow trainer class is neither TensorFlowTrainer nor "
            "Trainer in keras.src.backend.tensorflow.trainer"
        )
    return found
