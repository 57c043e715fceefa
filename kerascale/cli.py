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
    from kerascale.errors import KerascaleError
    from kerascale.hardware import detect_hardware
    from kerascale.planning import DataFacts, ModelFacts, Options, make_plan

    hw = detect_hardware()
    # The plan for a typical float32 model trained on arrays, all options "auto".
    try:
        plan = make_plan(hw, Options.validate(), ModelFacts(), DataFacts("arrays"))
        error = None
    except KerascaleError as e:
        plan, error = None, f"{type(e).__name__}: {e}"
    if args.json:
        report = {
            "version": __version__,
            "hardware": hw.to_dict(),
            "default_plan": plan.to_dict() if plan else None,
            "error": error,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"kerascale {__version__}")
    print(f"hardware: {hw.summary()}")
    if hw.cluster is not None:
        c = hw.cluster
        state = f"error: {c.error}" if c.error else f"{c.num_workers} worker(s)"
        print(f"cluster:  {c.source}: {state}")
    for note in hw.notes:
        print(f"note:     {note}")
    print()
    if plan is not None:
        print("Default plan for a float32 model, all options auto:")
        print(plan)
    else:
        print(f"No default plan: {error}")
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
