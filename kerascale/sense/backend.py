"""Which Keras backend runs the model: the one seam every backend choice reads.

Its design: docs/design/modules.md, `kerascale.sense.backend`.
"""

from __future__ import annotations

import dataclasses

import keras

SUPPORTED = ("tensorflow", "jax")


@dataclasses.dataclass(frozen=True)
class Traits:
    """What kerascale's stages need to know of a backend, as facts.

    Attributes:
        name: Keras's name for it.
        engine: What distributes it ("tf.distribute", "keras.distribution").
        feeds_datasets: Whether its `fit` takes everything through
            `tf.data` (TensorFlow), so that benches and the CLI feed a
            `tf.data.Dataset`; otherwise they feed arrays, as Keras batches
            them.
        reads_in_step_thread: Whether its `fit` reads each batch in the
            thread that dispatches the steps, so that a callback waiting on
            each step's logs serializes reading and stepping (JAX); the plan
            then reads ahead on a thread (`Prefetch`).
        readable_inputs: The inputs whose samples kerascale reads here.
        state_format: How a backup stores the training state: "tf"
            (`tf.train.Checkpoint`) or "arrays" (Keras's variables as NumPy).
        bf16_cpu_by_trial: Whether the rule keeps float32 on a CPU with bf16
            math, for the CPU trials to time bf16 on the user's own model:
            measured on other models, bf16 there was as often slower as
            faster (`bf16_cpu_why` says what was measured).
        bf16_cpu_why: Why, in the plan's words, where `bf16_cpu_by_trial`.
        profiler_needs_tensorflow: Whether its profile window writes through
            Keras's TensorBoard callback (TensorFlow's profiler).
        joins_tf_clusters: Whether a `TF_CONFIG`/SLURM/Vertex cluster means
            TensorFlow's multi-worker strategy here.
        even_batches: Whether its devices must divide each batch evenly (JAX
            lays a batch out along the mesh; `tf.distribute` splits an
            uneven one itself).
        empties_variables: Whether its `fit` takes the variables' values out
            while it trains, and leaves them out when its first step raises
            (JAX: `keras_compat.StateGuard` puts them back).
        reads_to_build: Whether its `fit` reads a batch through an iterator
            it drops, to build the loss and metrics (JAX), so that a
            `cache()` kerascale added warns that it discarded that read.
        places_by_scope: Whether a distribution places a model's variables
            only when the model is built in its scope (`tf.distribute`), so
            that a plan may re-create your model (JAX lays out the variables
            of the model as it is).
        copies_in_flight: Whether a host copy of the variables' values can
            be started without waiting for the step that computes them
            (`jax.device_put` is dispatched, and the next step's donated
            buffers are reused only once it has read them), so that a save
            behind training holds the step for the dispatch only; otherwise
            the copy is made on the training thread.
    """

    name: str
    engine: str
    feeds_datasets: bool
    reads_in_step_thread: bool
    readable_inputs: str
    state_format: str
    bf16_cpu_by_trial: bool
    profiler_needs_tensorflow: bool
    joins_tf_clusters: bool
    even_batches: bool
    empties_variables: bool = False
    bf16_cpu_why: str = ""
    reads_to_build: bool = False
    places_by_scope: bool = False
    copies_in_flight: bool = False


_TRAITS = {
    "tensorflow": Traits(
        name="tensorflow",
        engine="tf.distribute",
        feeds_datasets=True,
        reads_in_step_thread=False,
        readable_inputs="a tf.data.Dataset or NumPy arrays of numbers",
        state_format="tf",
        # benchmarks/README.md, "The batch moves with the steps per call":
        # one epoch at 8 steps a call, 2 cores with AVX512_BF16.
        bf16_cpu_by_trial=True,
        bf16_cpu_why=(
            "TensorFlow on CPU: bf16 runs faster for some models only (an MLP "
            "0.6-0.8x float32's speed, a CNN 0.95x, a Conv1D 1.1-1.4x on an "
            "AVX512_BF16 CPU)"
        ),
        profiler_needs_tensorflow=True,
        joins_tf_clusters=True,
        even_batches=False,
        places_by_scope=True,
    ),
    "jax": Traits(
        name="jax",
        engine="keras.distribution",
        feeds_datasets=False,
        reads_in_step_thread=True,
        readable_inputs="NumPy arrays of numbers",
        state_format="arrays",
        bf16_cpu_by_trial=True,
        bf16_cpu_why=(
            "JAX on CPU: XLA's CPU code runs bf16 no faster than float32 (a CNN "
            "0.96x, an MLP 0.74x on an AVX512_BF16 CPU)"
        ),
        profiler_needs_tensorflow=False,
        joins_tf_clusters=False,
        even_batches=True,
        empties_variables=True,
        reads_to_build=True,
        copies_in_flight=True,
    ),
}

# Where kerascale plans nothing: what `fit` hands to plain `model.fit`, and
# the few facts the CLI and the warnings still read.
_UNSUPPORTED = Traits(
    name="",
    engine="nothing",
    feeds_datasets=False,
    reads_in_step_thread=False,
    readable_inputs="NumPy arrays of numbers",
    state_format="arrays",
    bf16_cpu_by_trial=False,
    profiler_needs_tensorflow=True,
    joins_tf_clusters=False,
    even_batches=False,
)


def traits(backend: str | None = None) -> Traits:
    """The facts of `backend` (default: this process's)."""
    key = backend or name()
    found = _TRAITS.get(key)
    return found or dataclasses.replace(_UNSUPPORTED, name=key)


def name() -> str:
    """The Keras backend of this process: "tensorflow", "jax", "torch", ..."""
    return keras.backend.backend()


def supported(backend: str | None = None) -> bool:
    """Whether kerascale plans for `backend` (default: this process's)."""
    return (backend or name()) in SUPPORTED


def unsupported_warning(backend: str, skipped: list[str]) -> str:
    """The one warning `fit` gives on a backend it does not plan for."""
    what = f"; the options it ignored: {', '.join(skipped)}" if skipped else ""
    return (
        f"kerascale plans for the TensorFlow and JAX backends, and Keras runs on "
        f"{backend!r} here: trained with plain model.fit (Keras's own batch, "
        f"precision and devices){what}. To get kerascale's choices, run with "
        "KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow."
    )


def version(backend: str | None = None) -> str:
    """The installed version of `backend`'s library (default: this
    process's), or "" when it cannot be read; nothing is imported."""
    import importlib.metadata

    package = backend or name()
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""
