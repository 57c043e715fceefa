"""Where the benchmarks write their figures: benchmarks/results/NAME.json,
dated and with the machine they ran on."""

import datetime
import json
import os
import pathlib
import platform

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def write(name, **payload):
    """Writes results/NAME.json with the date, the machine and `payload`."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores",
        **payload,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2))
