"""How many training steps may run per call into the compiled step (Keras's
`steps_per_execution`) without changing what the run's callbacks see: the
bounds the run's callbacks put on an "auto" value. Pure.

Keras calls the batch hooks once per call when a call runs several steps.
A callback that overrides one (yours, or one of Keras's that counts calls)
then sees fewer calls, so an "auto" value stays 1 under it. kerascale's own
callbacks keep their meanings at several steps a call, given a value that
lands their steps on a call's end: a backup's every-N-updates saves, a
gradient-accumulation window's end.
"""

from __future__ import annotations

import dataclasses

from kerascale.plan.reasons import Reason
from kerascale.sense import backend as backend_lib

# The most steps one call runs, whatever the measurement asks: a call is
# also the unit a time budget stops at and a save waits for (a step of
# 1 ms at 128 a call is still an eighth of a second).
MAX_STEPS = 128
# A call stays under this, and under a quarter of an epoch.
MAX_CALL_SECONDS = 1.0
EPOCH_SHARE = 4


def held_by_replicas(backend: str, replicas: int) -> bool:
    """Whether one step a call is all Keras trains at: its TensorFlow fit
    fails at more under a `tf.distribute` strategy of several replicas
    (keras-team/keras#19246; `tests/test_compat.py` checks it still does)."""
    return backend_lib.traits(backend).engine == "tf.distribute" and replicas > 1


@dataclasses.dataclass(frozen=True)
class StepsLimit:
    """The bounds on an "auto" steps per call.

    Attributes:
        held: Why it stays 1 (a callback's batch hook), or None.
        divides: (optimizer updates, what needs them): the value divides
            each times the accumulation's micro-batches (a backup's save
            every N updates lands on a call's end).
    """

    held: Reason | None = None
    divides: tuple[tuple[int, str], ...] = ()
    # What counts each call's steps (a FaultTolerantBackup), which an epoch
    # of unknown length at several steps a call leaves it unable to do:
    # Keras gives a short last call the end a whole call would have.
    counts_steps: str = ""

    def dividing(self, steps: int, what: str) -> StepsLimit:
        """These bounds, and a value that divides `steps` (`what` needs it)."""
        return dataclasses.replace(self, divides=(*self.divides, (steps, what)))

    def largest(self, n: int, accumulation: int = 1) -> tuple[int, str]:
        """The largest value up to `n` these bounds allow, and what lowered
        it ("" where nothing did). With gradient accumulation of
        `accumulation` micro-batches, a call ends at an update's end: the
        value divides it or is a multiple of it."""
        if self.held is not None:
            return 1, str(self.held)
        for m in range(max(1, n), 0, -1):
            if accumulation > 1 and m % accumulation and accumulation % m:
                continue
            if all((d * accumulation) % m == 0 for d, _ in self.divides):
                if m == n:
                    return m, ""
                return m, _lowered_by(m, n, self.divides, accumulation)
        return 1, ""


def _lowered_by(
    m: int, n: int, divides: tuple[tuple[int, str], ...], accumulation: int
) -> str:
    whats = [what for d, what in divides if (d * accumulation) % n]
    if accumulation > 1 and n % accumulation and accumulation % n:
        whats.append(f"an accumulation window of {accumulation}")
    return f"{m}, not {n}, so that the calls fit " + " and ".join(whats)


def for_run(
    *,
    hook: tuple[str, str] | None,
    save_every: int | None,
    profile: tuple[int, int] | None,
    counts_steps: str = "",
    reshuffled_backup: bool = False,
) -> StepsLimit:
    """The bounds for a run: `hook` (a callback's name, the batch hook it
    overrides) holds it at 1; a backup's save every `save_every`
    updates needs a divisor of it; a profile window (Keras's TensorBoard and
    kerascale's JAX trace count calls as steps) holds it at 1;
    `counts_steps` names what counts each call's steps (a backup);
    `reshuffled_backup`: a backup of a TensorFlow run on a `tf.data`
    pipeline that draws new shuffle seeds each epoch holds it at 1 (its
    resume at several a call is not exact yet: the open finding in
    docs/conformance.md)."""
    held = None
    if hook is not None:
        who, name = hook
        held = Reason("steps.held", who=who, hook=name)
    elif profile is not None:
        held = Reason("steps.profile", window=tuple(profile))
    elif reshuffled_backup:
        held = Reason("steps.reshuffle")
    if held is not None:
        return StepsLimit(held=held, counts_steps=counts_steps)
    divides = ()
    if save_every:
        divides = ((save_every, f"a save every {save_every} updates"),)
    return StepsLimit(divides=divides, counts_steps=counts_steps)
