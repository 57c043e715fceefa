"""Whether an error means memory ran out: a fact about a failure, read by
the batch search's probes, the ladder's first-step rung and the tuner."""

from __future__ import annotations

from kerascale import _tf

# Text that only an allocation failure prints. TensorFlow: "OOM when allocating
# tensor", "ResourceExhaustedError"; the C++ runtime: "std::bad_alloc"; Python:
# "MemoryError"; glibc/mmap: "Cannot allocate memory".
_OOM_TEXT = (
    "resourceexhausted",
    "resource_exhausted",  # XLA's status code, in JAX's XlaRuntimeError
    "resource exhausted",
    "oom when allocating",
    "out of memory",
    "bad_alloc",
    "memoryerror",
    "cannot allocate memory",
    "failed to allocate",
    "unable to allocate",  # NumPy's MemoryError, also when Keras wraps it
    # A copy to a GPU whose allocator cannot hold the destination (an
    # InternalError, not ResourceExhaustedError, in TensorFlow's copy code).
    "dst tensor is not initialized",
)


def looks_like_oom(text: str) -> bool:
    low = text.lower()
    return any(t in low for t in _OOM_TEXT)


def is_oom_exception(e: BaseException) -> bool:
    """Whether an exception means memory ran out (TensorFlow's
    ResourceExhaustedError, JAX's XlaRuntimeError RESOURCE_EXHAUSTED, ...)."""
    if isinstance(e, MemoryError) or _tf.is_instance(
        e, "errors", "ResourceExhaustedError"
    ):
        return True
    return looks_like_oom(f"{type(e).__name__}: {e}")
