"""The Plan: every decision for one training run, decided once, before
anything runs, with the reason for each. It prints as a small table,
serialises to JSON, and is the fingerprint a checkpoint is checked against."""

from __future__ import annotations

import dataclasses
import json
import textwrap
import types
from collections.abc import Mapping
from typing import Any

from kerascale._display import Table
from kerascale.errors import ConfigurationError
from kerascale.plan import reasons as reasons_lib
from kerascale.plan.data_changes import DataChanges
from kerascale.sense import backend as backend_lib


@dataclasses.dataclass(frozen=True)
class Plan(Table):
    """Every decision for one training run, and why each was made.

    Attributes:
        strategy: The distribution strategy's name ("default", "one_device",
            "mirrored", "tpu", or the class name of a strategy you passed).
        devices: The devices that hold a replica.
        replicas: Model replicas trained in sync.
        precision: The Keras dtype policy name.
        micro_batch_size: Samples per replica per forward pass.
        accumulation_steps: Forward passes per optimizer update.
        global_batch_size: Samples per optimizer update, equal to
            `micro_batch_size * replicas * accumulation_steps`.
        lr_factor: The factor applied to the learning rate.
        rebuild: Whether the model is re-created under the policy and scope.
        data_changes: What kerascale changed in the input pipeline (a
            `DataChanges`; `str()` of it in words).
        hardware: A one-line summary of the hardware.
        reasons: Field name -> why it has its value: a
            `kerascale.plan.reasons.Reason`, whose `code` says which rule or
            measurement decided and whose `str` is its words (a plan read
            back from JSON has the words only).
        warnings: Things the user should know (e.g. mixed GPU types).
        backend: The Keras backend planned for: "tensorflow" (strategies
            are `tf.distribute`'s) or "jax" (`keras.distribution`'s).
        sharding: For strategy "model_parallel" (JAX): {"mesh": [batch,
            model], "layouts": {variable path: its axes' mesh names},
            "bytes": {"replicated": per-device bytes of one replica,
            "sharded": per device under the mesh}}; else empty.
        recompute: Keras's recomputation (rematerialization) mode set on
            the model's layers for the run ("activations"), or "" for none.
            Where the batch wanted does not fit in one forward pass, it is
            weighed against gradient accumulation alone by measured
            throughput (`kerascale.measure.recompute`).
        steps_per_execution: Training steps per call into the compiled step
            (Keras's `steps_per_execution`), set on the model for the run.
            The same updates in the same order as one step a call; Keras
            calls the callbacks' batch hooks once per call.
    """

    strategy: str
    devices: tuple[str, ...]
    replicas: int
    precision: str
    micro_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    lr_factor: float = 1.0
    rebuild: bool = False
    data_changes: DataChanges = dataclasses.field(default_factory=DataChanges)
    hardware: str = ""
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    backend: str = "tensorflow"
    sharding: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    recompute: str = ""
    steps_per_execution: int = 1

    def __post_init__(self):
        # Frozen means frozen: the reasons cannot be edited behind the plan's back.
        object.__setattr__(self, "reasons", types.MappingProxyType(dict(self.reasons)))
        expected = self.micro_batch_size * self.replicas * self.accumulation_steps
        if expected != self.global_batch_size:
            raise ConfigurationError(
                "global_batch_size must equal micro_batch_size * replicas * "
                f"accumulation_steps = {expected}. Received: "
                f"global_batch_size={self.global_batch_size}"
            )

    @property
    def step_batch_size(self) -> int:
        """Samples in one forward pass across replicas: the dataset's batch."""
        return self.micro_batch_size * self.replicas

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, DataChanges):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON; `Plan.from_json` reads it back."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigurationError(
                f"Unknown Plan field(s) {sorted(unknown)}; known: {sorted(names)}."
            )
        kwargs = dict(d)
        for key in ("devices", "warnings"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if "data_changes" in kwargs:
            kwargs["data_changes"] = DataChanges.from_saved(kwargs["data_changes"])
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        return self.describe()

    def explain(self) -> str:
        """The plan as a table with every reason in full (`describe` gives
        each in brief)."""
        return self.describe(full=True)

    def describe(self, *, warnings: bool = True, full: bool = False) -> str:
        """The plan as a table, each decision with its reason in brief (at
        most about 60 characters; `full`, or `explain()`, for all of it);
        `warnings`: with the plan's warnings as last rows."""
        rows = [
            ("hardware", self.hardware, ""),
            (
                "backend",
                self.backend,
                f"Keras's backend (KERAS_BACKEND); distributed with "
                f"{backend_lib.traits(self.backend).engine}",
            ),
            (
                "strategy",
                f"{self.strategy} ({self.replicas} replica"
                f"{'s' if self.replicas != 1 else ''})",
                self.reasons.get("strategy", ""),
            ),
            ("precision", self.precision, self.reasons.get("precision", "")),
            (
                "batch",
                f"{self.micro_batch_size} x {self.replicas} x "
                f"{self.accumulation_steps} = {self.global_batch_size}",
                "; ".join(
                    r
                    for r in (
                        self.reasons.get("global_batch_size", ""),
                        self.accumulation_steps > 1
                        and self.reasons.get("accumulation_steps", ""),
                    )
                    if r
                ),
            ),
        ]
        growth = self.reasons.get("batch_growth")
        if growth:
            in_run = reasons_lib.code(growth) == "growth.in_run"
            value = "in the run" if in_run else "no"
            rows.append(("batch growth", value, growth))
        updates = self.reasons.get("updates_per_epoch")
        if updates:  # its figures from its details (words alone from JSON)
            d = getattr(updates, "details", {})
            value = f"{d['before']} -> {d['after']} updates an epoch" if d else ""
            rows.append(("updates", value, updates))
        if self.sharding:
            batch, model = self.sharding["mesh"]
            rows.append(
                (
                    "mesh",
                    f"{batch} x {model} (batch x model), "
                    f"{len(self.sharding['layouts'])} variables split",
                    self.reasons.get("sharding", ""),
                )
            )
        if self.recompute or self.reasons.get("recompute"):
            rows.append(
                (
                    "recompute",
                    self.recompute or "no",
                    self.reasons.get("recompute", ""),
                )
            )
        steps = self.reasons.get("steps_per_execution", "")
        # Shown where it is not Keras's default left unmeasured (or kept by
        # the several-replica rule, whose dropping of a value is a warning).
        quiet = ("steps.default", "steps.replicas", "")
        if self.steps_per_execution != 1 or (
            steps and reasons_lib.code(steps) not in quiet
        ):
            rows.append(("steps per call", str(self.steps_per_execution), steps))
        if self.lr_factor != 1.0:
            rows.append(
                ("lr factor", f"{self.lr_factor:g}", self.reasons.get("lr_factor", ""))
            )
        rows.append(
            (
                "model",
                "re-created" if self.rebuild else "yours, as it is",
                self.reasons.get("rebuild", ""),
            )
        )
        rows.append(
            (
                "data",
                str(self.data_changes),
                self.reasons.get("data_changes", ""),
            )
        )
        lines = ["kerascale plan (batch = micro x replicas x accumulation = global)"]
        lines += _table(rows, full=full)
        if warnings:
            lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


BRIEF = 60  # characters of a reason in the plan's default view
# The table fits WIDTH columns, in a terminal and in a notebook's output: a
# value longer than VALUE columns, and a reason longer than the room left of
# WIDTH, wrap under their row (values ran to 60 columns and reasons began at
# column 100-130 on some machines).
WIDTH, VALUE = 100, 30


def _table(rows: list[tuple[str, str, str]], *, full: bool) -> list[str]:
    """The rows (name, value, reason) as aligned lines of at most `WIDTH`
    columns (a word longer than its column excepted); each value and reason
    in brief unless `full`."""
    if not full:
        rows = [(name, brief(value), brief(why)) for name, value, why in rows]
    w0 = max(len(r[0]) for r in rows)
    w1 = min(VALUE, max(len(r[1]) for r in rows))
    room = max(30, WIDTH - (2 + w0 + 2 + w1 + 2))
    lines = []
    for name, value, why in rows:
        values, whys = _wrapped(value, w1), _wrapped(why, room) if why else []
        for i in range(max(len(values), len(whys))):
            left = f"  {name if i == 0 else '':<{w0}}  "
            left += f"{values[i] if i < len(values) else '':<{w1}}"
            lines.append(f"{left}  {whys[i] if i < len(whys) else ''}".rstrip())
    return lines


def _wrapped(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` columns, words kept whole."""
    return textwrap.wrap(
        text, width=width, break_long_words=False, break_on_hyphens=False
    ) or [text]


def brief(text: str, limit: int = BRIEF) -> str:
    """`text` in at most `limit` characters: as it is where it fits; else
    without its parenthesised asides; else its first clause (before "; "),
    or what that clause concludes (after "X: "); else cut at a word, with
    an ellipsis."""
    if len(text) <= limit:
        return text
    short = _without_asides(text)
    first = short.split("; ", 1)[0]
    concluded = first.split(": ", 1)[-1]
    for candidate in (short, first, concluded):
        if len(candidate) <= limit:
            return candidate
    return concluded[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "\u2026"


def _without_asides(text: str) -> str:
    """`text` less every parenthesised part (nested ones too) and the space
    before it."""
    out: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
            if depth == 1 and out and out[-1] == " ":
                out.pop()
        elif ch == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out).strip()
