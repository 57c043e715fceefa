"""How the batch of a plan is measured: the batch-size search for an "auto"
batch, the memory check of a requested one (`batch_for_plan`), and the
warnings where the model or the data cannot be probed. `decide` runs it
between its first plan and the final one."""

from __future__ import annotations

from typing import Any

from kerascale.errors import BatchSizeSearchError
from kerascale.measure import answered, engines
from kerascale.measure import batch as batch_lib
from kerascale.measure import request as request_lib
from kerascale.measure.decided import Found
from kerascale.measure.request import (
    AUTO_MIN_STEPS,
    Given,
    SearchDeclined,
    SearchOptions,
    SearchRequest,
    check_options,
    request_for,
)
from kerascale.measure.result import BatchSearchResult
from kerascale.measure.stages import At, Priceless
from kerascale.plan.fallback import FailedInProbe
from kerascale.plan.measured import Measured
from kerascale.plan.options import Options, user_instance
from kerascale.plan.plan import Plan
from kerascale.plan.planner import Planner
from kerascale.plan.rules import searched_batch
from kerascale.sense import data_facts
from kerascale.sense.data_facts import DataFacts
from kerascale.sense.hardware import Hardware
from kerascale.sense.model_facts import ModelFacts, gist

# Why an "auto" batch on a CPU is Keras's (benchmarks/time_to_accuracy.py: the
# fastest batch by samples per second, 800 with the learning rate unchanged,
# cost a sequence model 0.04 of held-out accuracy, one seed of 3 at chance).
CPU_KEEPS_KERAS = (
    "on a CPU the fastest batch in samples per second is not the fastest to an "
    "accuracy: with the learning rate unchanged it trains fewer updates an epoch, "
    "and can need more epochs or end worse. Keras's batch trains as model.fit "
    "does"
)


def needs_check(
    options: Options, data: DataFacts, hw: Hardware, search: SearchOptions | None
) -> bool:
    """Whether a requested batch is checked against memory (and split with
    gradient accumulation if it does not fit): on GPUs and TPUs, whose memory
    is small and fixed, or wherever `memory_limit` is given; not when the
    split is already stated (accumulation_steps, max_batch_size) or the data
    makes its own batches (a PyDataset)."""
    if searched_batch(options, data) or data.kind in ("pydataset", "other"):
        return False
    if not data.measurable:
        return False
    if options.accumulation_steps or options.max_batch_size:
        return False
    limit = search is not None and (search.memory_limit or search.device_memory)
    return hw.accelerator in ("gpu", "tpu") or bool(limit)


class ProbeFailed(Exception):
    """An automatic search's probe failed for a reason other than memory."""


def batch_for_plan(
    given: Given,
    options: Options,
    planner: Planner,
    plan: Plan,
    search: SearchOptions | None,
) -> tuple[BatchSearchResult | None, str]:
    """(the batch search's result or None, a warning: why a search, a check
    or a memory_limit was not used), for `plan`, made by `planner` (whose
    facts it reads), over `given`. On a CPU an "auto" batch is Keras's: the
    run's own measurements move it where they pay (`apply.batch_growth`),
    so nothing is probed before it unless a bound you gave asks for a check.

    Raises:
        SearchDeclined: An "auto" batch on a CPU with no bound to check.
    """
    hw, facts, data = planner.hardware, planner.model, planner.data
    run: dict[str, Any] = dict(instance=user_instance(options), verbose=options.verbose)
    wanted = searched_batch(options, data)
    check = not wanted and needs_check(options, data, hw, search)
    if wanted and hw.accelerator == "cpu" and (search is None or search.mode == "auto"):
        # A bound you gave checks Keras's batch against it (split with
        # accumulation where it does not fit); without one, nothing is probed.
        bounded = search is not None and (search.memory_limit or search.max_batch_size)
        if not bounded:
            raise SearchDeclined(CPU_KEEPS_KERAS)
        wanted, check = False, data.measurable
    cannot = unmeasurable(facts, data, wanted, check)
    if cannot is not None:
        return None, cannot
    if wanted:
        search = search or SearchOptions(min_steps_per_epoch=AUTO_MIN_STEPS)
        request = SearchRequest(given, data, plan, hw, search, **run)
        return searched(request), ""
    if check:
        # Does the requested batch fit in one forward pass? One probe if it
        # does; otherwise the largest micro-batch, for the accumulation split.
        # Probes carry accumulators (k=2): the split will need them.
        recalled = answered.recall(given.model, given.x, given.y, plan, search)
        if recalled is not None:
            return recalled, ""
        checked = check_options(search, plan.micro_batch_size * plan.replicas)
        request = SearchRequest(
            given,
            data,
            plan,
            hw,
            checked,
            **run,
            first=plan.micro_batch_size,
            accumulation_steps=2,
        )
        return searched(request), ""
    if search is not None and search.memory_limit:
        why = (
            "your PyDataset makes its own batches"
            if data.kind == "pydataset"
            else "accumulation_steps or max_batch_size already states the split"
            if options.accumulation_steps or options.max_batch_size
            else f"your dataset brings its own batch of {data.batch_size}"
        )
        return None, f"memory_limit was not used (nothing was probed): {why}."
    return None, ""


def probeable(facts: ModelFacts, data: DataFacts, hw: Any) -> None:
    """For `find_batch_size`, whose search is its answer: nothing where the
    data and the model can be probed.

    Raises:
        BatchSizeSearchError: Naming what cannot be probed, and the fix.
    """
    if not data.measurable:
        raise BatchSizeSearchError(
            f"The data cannot be probed: {data.why_not_measurable}. Pass "
            f"{data_facts.readable_inputs(hw.backend)}."
        )
    if not facts.measurable:
        raise BatchSizeSearchError(
            f"The model cannot be probed: {_unprobeable(facts)}."
        )


def _unprobeable(facts: ModelFacts) -> str:
    return (
        "kerascale can neither copy your model nor put back what a probe "
        f"would change ({facts.why_not_measurable})"
    )


def unmeasurable(
    facts: ModelFacts, data: DataFacts, wanted: bool, check: bool
) -> str | None:
    """The warning when a search or check is wanted and the data or the model
    cannot be probed ("" where the plan's own warning says it), else None."""
    if wanted and not data.measurable:
        return ""  # the plan's warning says what was skipped
    if not (wanted or check) or facts.measurable:
        return None
    why = _unprobeable(facts)
    if wanted:
        return (
            f"No batch search: {why}. Training at Keras's default batch; "
            "pass batch_size= to choose."
        )
    return f"batch_size was not checked against memory: {why}."


def searched(request: SearchRequest) -> BatchSearchResult:
    """The engine's answer to `request`; a probe's failure other than memory
    is `ProbeFailed`, for the decision to answer."""
    try:
        return engines.batch_search(request)
    except BatchSizeSearchError as e:
        if e.out_of_memory:
            raise
        raise ProbeFailed(gist(RuntimeError(e.probe_message or str(e)))) from e


def _search_anyway(hw: Hardware) -> str:
    """How to get the batch the skipped search would have picked (its mode;
    "max" is find_batch_size's default)."""
    mode = batch_lib.auto_mode(hw)
    mode = "" if mode == "max" else f", mode={mode!r}"
    return (
        "to search anyway, pass batch_size=kerascale.find_batch_size(model, "
        f"data{mode}).batch_size"
    )


class BatchSearched(Priceless):
    """fit's batch: the search's answer for an "auto" one, the memory check of
    a requested one (`batch_plan.batch_for_plan`). On a CPU an "auto" batch
    is Keras's, and nothing is probed before the run (issue 78).

    A probe that fails for a reason other than memory is not fit's error to
    raise: under a mixed precision kerascale chose, it is the ladder's
    `FailedInProbe`; otherwise the search is dropped (the real run then
    raises the model's error, as `model.fit` would). Carries "asked" (the
    batch per replica asked for, None for "auto")."""

    name = "search"

    def skip(self, at: At) -> Found | None:
        return None

    def measure(self, at: At) -> Found:
        decided = at.decided
        hw, facts, data = decided.hardware, decided.model, decided.data
        options, plan = decided.options, decided.plan
        asked = None if searched_batch(options, data) else plan.micro_batch_size
        found, skipped, hint = Measured(), "", None
        try:
            result, note = batch_for_plan(
                at.given, options, decided.planner, plan, at.search
            )
        except request_lib.SearchSkipped as e:
            result, note, skipped, hint = None, "", str(e), e.hint
        except ProbeFailed as e:
            if options.precision == "auto" and plan.precision != facts.policy:
                raise FailedInProbe(
                    str(e), tried=plan.precision, policy=facts.policy
                ) from e
            result = None
            note = (
                f"No batch search: a probe failed for a reason other than memory "
                f"({e}). Training at Keras's default batch; pass batch_size= to "
                "choose."
            )
        found = found.warned(note)
        if skipped:
            hint = hint or _search_anyway(hw)
            found = found.noted(
                "global_batch_size", f"batch search skipped: {skipped}; {hint}"
            )
        settled = {"search": result, "search_skipped": skipped}
        return Found(found, settled, {"asked": asked})


class Searched(Priceless):
    """find_batch_size's search, whatever batch the data brings; its failures
    are the caller's errors (`BatchSizeSearchError`), and the pipeline is
    timed as given."""

    name = "search"

    def skip(self, at: At) -> Found | None:
        return None

    def measure(self, at: At) -> Found:
        decided = at.decided
        probeable(decided.model, decided.data, decided.hardware)
        request = request_for(decided, at.given, decided.plan, at.search)
        skipped = ""
        try:
            result = engines.batch_search(request)
        except request_lib.SearchSkipped as e:  # no answer here: the caller says why
            result, skipped = None, str(e)
        settled = {"search": result, "search_skipped": skipped, "optimize_data": False}
        return Found(settled=settled)
