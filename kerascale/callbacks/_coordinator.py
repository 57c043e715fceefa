"""Where `FaultTolerantBackup`'s run meets the outside: this process's
SIGTERM, the other workers (every worker saves and stops at the step all of
them agreed on), and the checkpoint directory's lease (one writer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from kerascale.apply import step_agreement as agreement_lib
from kerascale.callbacks import _lease as lease_lib
from kerascale.callbacks._base import FitRun
from kerascale.callbacks._preemption import SigtermWatch
from kerascale.errors import CheckpointError, warn

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect


class Coordinator:
    """One training run's SIGTERM, worker agreement and lease."""

    def __init__(self) -> None:
        self.sigterm = SigtermWatch()
        self.agreement: agreement_lib.Agreement | None = None
        self.lease: lease_lib.Lease | None = None

    def start(
        self,
        model: Any,
        run: FitRun,
        directory: str,
        *,
        chief: bool,
        lease_timeout: float,
        in_use: Callable[[], bool],
    ) -> None:
        """Joins the other workers' agreement, where there are others, and
        the chief takes the directory's lease; across workers, every worker
        raises the chief's `CheckpointError`."""
        self.agreement = agreement_lib.for_run(model, run)
        problem = None
        if chief:
            self.lease, problem = lease_lib.taken(
                directory, lease_timeout, in_use=in_use
            )
        if self.agreement is not None:
            problem = self.agreement.from_chief("lease", problem)
        if problem is not None:
            raise CheckpointError(problem)

    @property
    def alone(self) -> bool:
        """Whether this worker decides alone (no other worker)."""
        return self.agreement is None

    @property
    def worker_id(self) -> int:
        return self.agreement.worker_id if self.agreement is not None else 0

    def at_step(
        self, epoch: int, batch: int, *, time_due: bool, save_owed: bool
    ) -> tuple[bool, bool]:
        """(preempt, a time-based save due) at this step: this worker's own
        view, or across workers what all of them agreed on for this step."""
        preempt = self.sigterm.requested
        if self.agreement is not None:
            if preempt:
                self.agreement.want("preempt")
            if time_due and not save_owed:
                self.agreement.want("save")
            decided = self.agreement.at_step(epoch, batch)
            preempt, time_due = "preempt" in decided, "save" in decided
        return preempt, time_due

    def preempted_alone(self) -> bool:
        """SIGTERM came, and no other worker need agree on the step."""
        return self.sigterm.requested and self.alone

    def finish(self) -> bool:
        """At the run's end: whether it was preempted (on any worker)."""
        if self.agreement is not None:
            return "preempt" in self.agreement.finish()
        return self.sigterm.requested

    def workers(self, what: str) -> tuple[Any, str]:
        """What a checkpoint's metadata records of the workers for `what`."""
        return self.agreement, what

    def check_lease(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def release(self) -> None:
        """Gives back the agreement's thread, the lease and the handler."""
        agreement, self.agreement = self.agreement, None
        if agreement is not None:
            agreement.close()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()
        self.sigterm.release()

    def exit(self, saved: str | None, own: bool) -> NoReturn:
        """Exits with code 143 after a preemption's save (`own`: this
        worker's SIGTERM, passed on to the handler before; else another's)."""
        whose = "SIGTERM" if own else "SIGTERM to another worker"
        warn(
            f"Preempted ({whose}): saved {saved}; exiting with code "
            f"{PREEMPTED_EXIT_CODE}. Rerun the same command to resume."
        )
        if own:
            self.sigterm.pass_on()
        raise SystemExit(PREEMPTED_EXIT_CODE)
