"""Every use of JAX's private API, in one place.

Each function names what it reads and why there is no public way; each has a
test in tests_jax/test_compat_jax.py that fails when JAX changes it.

Whether JAX's backends have started (`xla_bridge.backends_are_initialized`):
`jax.distributed.initialize` refuses to join once they have, with a
RuntimeError whose text is the only public sign; asked first instead.

The key-value store of JAX's coordination service (`jax.distributed`): the
same service and store as TensorFlow's (XLA's `DistributedRuntimeClient`),
with no public API: `jax/_src/distributed.py`'s `global_state.client` only
(Orbax's multi-host utilities read it the same way). kerascale's decisions
that every process takes at the same step (`apply.step_agreement`) need it, as on
TensorFlow. The same three names as `_tf_compat`'s store, so that an
`Agreement` runs on either.
"""

from __future__ import annotations

from typing import Any


class KeyTaken(Exception):
    """A key of the store was written before (a key is written once)."""


class KeyTimeout(Exception):
    """A key did not come in time."""


KV_TAKEN = (KeyTaken,)
KV_TIMEOUT = (KeyTimeout,)
KV_ERRORS: tuple[type[BaseException], ...]  # for type checkers: `__getattr__`


def __getattr__(name: str) -> Any:
    if name == "KV_ERRORS":  # the above, and a service that is gone
        import jax

        return (KeyTaken, KeyTimeout, jax.errors.JaxRuntimeError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _client() -> Any:
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("JAX's processes are not joined (jax.distributed).")
    return client


def kv_set(key: str, value: str) -> None:
    """Writes `key` once in the store; `KeyTaken` if it was written before."""
    import jax

    try:
        _client().key_value_set(key, value)
    except jax.errors.JaxRuntimeError as e:
        if "ALREADY_EXISTS" in str(e):
            raise KeyTaken(key) from e
        raise


def kv_get(key: str, timeout: float | None) -> str:
    """Waits for `key` (at most `timeout` seconds, or a day when None);
    `KeyTimeout` when it does not come in time."""
    import jax

    ms = 86_400_000 if timeout is None else max(1, int(timeout * 1000))
    try:
        return _client().blocking_key_value_get(key, ms)
    except jax.errors.JaxRuntimeError as e:
        if "DEADLINE_EXCEEDED" in str(e):
            raise KeyTimeout(key) from e
        raise


def backends_started() -> bool:
    """Whether JAX has started its backends in this process (any computation,
    `jax.devices()`...): then `jax.distributed.initialize` cannot join."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())
