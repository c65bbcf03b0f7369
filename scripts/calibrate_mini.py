"""One calibration run of the mini tier, in-process, on the VALIDATION set (never the test set).

    python scripts/calibrate_mini.py NAME [preset=mini|mini-groups] [key=value ...]

Runs the preset (default ``mini``) with ``evaluation-split = "validation"``, seed 100 (outside
the claims' seeds 0-9) and the given keys through the real ServerApp and ClientApp in this
process (``run_inprocess``, the code path of ``fedtune claims run``), on one torch thread, and
appends {name, seconds (wall), cpu-seconds, curve [(round, validation accuracy %)], keys} to
results/calib/records.jsonl. docs/claims/calibration-mini.md lists the runs it made.
"""

import json
import sys
import time
from pathlib import Path

import torch

from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.config import load_preset

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "calib"


def parse(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value, value)


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    name, given = argv[0], dict(a.split("=", 1) for a in argv[1:])
    import fedtune_app.methods  # noqa: F401 - registers the method-owned keys presets may set

    keys = load_preset(given.pop("preset", "mini")) | {
        "evaluation-split": "validation", "seed": 100, "checkpoint-every": 0,
        "proxy-for-all-methods": True, "results-dir": str(OUT / "runs")}
    keys |= {k: parse(v) for k, v in given.items()}
    started, cpu = time.perf_counter(), time.process_time()
    folder = run_inprocess(keys)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    metrics = json.loads((Path(folder) / "metrics.json").read_text())
    curve = [(m["round"], round(100 * m["accuracy"], 1)) for m in metrics
             if m.get("accuracy") is not None]
    record = {"name": name, "seconds": round(seconds, 1), "cpu-seconds": round(cpu, 1),
              "curve": curve, "keys": {k: v for k, v in keys.items() if k != "results-dir"}}
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "records.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(name, f"{seconds:.0f} s wall, {cpu:.0f} s CPU", curve)


if __name__ == "__main__":
    main(sys.argv[1:])
