"""`Measured`: what planning found beyond the rules, as the plan states it.

Each stage of the decision (the sharding check, the batch search, the
trials, recomputation weighed, the cluster's agreement, a resumed
checkpoint's pins, a retry after a failed first step) records what it found
here; `rules.make_plan` renders it into the plan's reasons and warnings. No
stage edits a plan another made: the plan is made again, whole, from the
options and everything measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

from kerascale.plan import reasons as reasons_lib
from kerascale.plan.reasons import Reason


class SearchAnswer(Protocol):
    """What a plan reads of a batch search's answer
    (`kerascale.measure.result.BatchSearchResult`, made after the plan's
    stage)."""

    @property
    def per_replica_batch_size(self) -> int: ...

    @property
    def cached(self) -> bool: ...

    @property
    def reasons(self) -> Mapping[str, str]: ...


@dataclasses.dataclass(frozen=True)
class Measured:
    """What planning found, per plan field.

    Attributes:
        reasons: A field's reason where a measurement (not a rule) decided
            it: replaces the rule's reason.
        notes: Added to a field's reason in parentheses, where the
            measurement that would have decided it was skipped.
        warnings: Said once, before training.
        materialized: Where the input was materialized to ("" where it was
            not): the data changes say so first.
    """

    reasons: Mapping[str, Reason] = dataclasses.field(default_factory=dict)
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    materialized: str = ""

    def decided(self, **reasons: Reason) -> Measured:
        """With each field's reason set (its skip note dropped)."""
        notes = {k: v for k, v in self.notes.items() if k not in reasons}
        return dataclasses.replace(
            self,
            reasons={**self.reasons, **reasons},
            notes=notes,
        )

    def noted(self, field: str, note: str) -> Measured:
        """With `note` added to `field`'s reason."""
        return dataclasses.replace(self, notes={**self.notes, field: note})

    def warned(self, *warnings: str) -> Measured:
        """With `warnings` added (each once)."""
        said = list(self.warnings)
        for w in warnings:
            if w and w not in said:
                said.append(w)
        return dataclasses.replace(self, warnings=tuple(said))

    def __or__(self, other: Measured) -> Measured:
        """Both: `other`'s reasons, notes and materialization win."""
        merged = self.decided(**other.reasons).warned(*other.warnings)
        for field, note in other.notes.items():
            merged = merged.noted(field, note)
        return dataclasses.replace(
            merged, materialized=other.materialized or self.materialized
        )

    def stated(
        self, reasons: Mapping[str, str], warnings: tuple[str, ...]
    ) -> tuple[dict[str, str], tuple[str, ...]]:
        """The rules' `reasons` and `warnings` with these findings in."""
        stated = {**reasons, **self.reasons}
        for field, note in self.notes.items():
            stated[field] = reasons_lib.noted(stated.get(field, ""), note)
        if self.materialized:
            why = stated.get("data_changes", "")
            stated["data_changes"] = reasons_lib.after(why, self.materialized)
        new = tuple(w for w in self.warnings if w not in warnings)
        return stated, (*warnings, *new)


NOTHING = Measured()
