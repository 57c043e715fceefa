"""The `kerascale` command line.

`kerascale doctor` prints what kerascale sees here and what it would decide for
a model trained on this machine, with the reason for each decision.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from kerascale import __version__


def _doctor(args: argparse.Namespace) -> int:
    from kerascale import precision, strategy
    from kerascale.errors import KerascaleError
    from kerascale.hardware import detect_hardware

    hw = detect_hardware()
    decisions: dict[str, dict[str, object]] = {}
    try:
        choice = strategy.choose(hw, "auto")
        decisions["strategy"] = {
            "value": choice.name,
            "replicas": choice.replicas,
            "devices": list(choice.devices),
            "why": choice.reason,
            "warnings": list(choice.warnings),
        }
    except KerascaleError as e:
        decisions["strategy"] = {"value": None, "why": str(e)}
    policy, why, warnings = precision.choose(hw, "auto")
    decisions["precision"] = {"value": policy, "why": why, "warnings": list(warnings)}
    if args.json:
        print(json.dumps({"hardware": hw.to_dict(), "decisions": decisions}, indent=2))
        return 0
    print(f"kerascale {__version__}")
    print(f"hardware   {hw.summary()}")
    if hw.cluster is not None:
        c = hw.cluster
        state = f"error: {c.error}" if c.error else f"{c.num_workers} worker(s)"
        print(f"cluster    {c.source}: {state}")
    for name, d in decisions.items():
        extra = f" x{d['replicas']}" if d.get("replicas", 1) != 1 else ""
        print(f"{name:<10} {d['value']}{extra}  ({d['why']})")
        for w in d.get("warnings", ()):
            print(f"           warning: {w}")
    for note in hw.notes:
        print(f"note       {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerascale",
        description="Train Keras models at the scale of the hardware here.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor", help="show the detected hardware and the default decisions"
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
