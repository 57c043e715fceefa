"""Which of kerascale's Keras fixes this Keras needs, for `kerascale doctor`.

Each fix is "active" (this Keras has the code it was written for, and it is
applied where it is needed), "not needed" (this Keras does not have what it
works around) or "unknown" (upstream changed in a way not yet seen: the fix
steps aside and says so where it would act). `TESTED` is the Keras the suite
last passed on, each lane's (README's test command runs both).
"""

from __future__ import annotations

from typing import Any

# The Keras versions README's test command passed on, last on 2026-12-02
# (the keras-nightly lane pins its build).
TESTED = ("3.15.1", "3.16.0.dev2026102704")


def report(*, tf_distribute: bool) -> dict[str, Any]:
    """This Keras, the ones the suite passed on, and each fix's status, as
    `kerascale doctor` shows them (never raising on a new Keras).
    `tf_distribute`: whether this backend trains with tf.distribute (the
    multi-worker and accumulation fixes are its)."""
    import keras

    try:
        found = fixes(tf_distribute=tf_distribute)
    except Exception as e:  # doctor reports; it never fails on a new Keras
        found = [_row("all", "", "unknown", f"{type(e).__name__}: {e}")]
    return {
        "version": keras.__version__,
        "tested": list(TESTED),
        "newer": newer_than_tested(keras.__version__),
        "fixes": found,
    }


def fixes(*, tf_distribute: bool) -> list[dict[str, str]]:
    """Each fix: its name, the upstream issue, its status and why."""
    rows = [_epoch_order()]
    if tf_distribute:
        rows += [_multi_worker(), _accumulation()]
    return rows


def _row(name: str, upstream: str, status: str, why: str) -> dict[str, str]:
    return {"fix": name, "upstream": upstream, "status": status, "why": why}


def _epoch_order() -> dict[str, str]:
    from kerascale._keras_compat import epoch_order

    name, upstream = "resume in the saved data order", epoch_order.UPSTREAM
    if not epoch_order.keras_fit_holds_the_epoch_iterator():
        return _row(
            name,
            upstream,
            "unknown",
            "Keras's fit no longer names its epoch iterator; a resume's order "
            "check still warns where the order differs",
        )
    if _adapter_counter() is None:
        return _row(
            name,
            upstream,
            "not needed",
            "this Keras shuffles from the global random state, which the "
            "checkpoint puts back",
        )
    return _row(
        name,
        upstream,
        "active",
        "this Keras seeds its shuffle from the data adapter's epoch counter, "
        "which the checkpoint records and puts back",
    )


def _adapter_counter() -> Any:
    import numpy as np
    from keras.src.trainers.data_adapters import get_data_adapter

    from kerascale._keras_compat import epoch_order

    x = np.zeros((2, 1), "float32")
    return epoch_order.counter(get_data_adapter(x=x, batch_size=1, shuffle=True))


def _multi_worker() -> dict[str, str]:
    from kerascale import _keras_compat as compat

    changed = compat.upstream_changed()
    if changed:
        return _row(
            "multi-worker fit",
            "keras-team/keras#20585",
            "unknown",
            f"upstream changed {', '.join(changed)}: not applied",
        )
    return _row(
        "multi-worker fit",
        "keras-team/keras#20585",
        "active",
        "applied under a MultiWorkerMirroredStrategy only",
    )


def _accumulation() -> dict[str, str]:
    from kerascale._keras_compat import distributed_accumulation as fix

    upstream = "keras-team/keras#20582"
    name = "accumulation under tf.distribute"
    if fix.upstream_known():
        return _row(
            name,
            upstream,
            "active",
            "applied to an optimizer built under a strategy of its own",
        )
    return _row(
        name,
        upstream,
        "unknown",
        "upstream changed _backend_apply_gradients: not applied",
    )


def newer_than_tested(version: str) -> bool:
    """Whether `version` is newer than every Keras in `TESTED` (a release
    sorts after its dev builds; packaging is a dependency of Keras)."""
    from packaging.version import InvalidVersion, Version

    try:
        return all(Version(version) > Version(tested) for tested in TESTED)
    except InvalidVersion:
        return True
