"""Check that a code change leaves results unchanged, bit for bit.

    python scripts/same_results.py run OUT        # the reference runs, results under OUT/
    python scripts/same_results.py compare A B    # exit 1 and name every difference

The runs: the main job (pyproject's run config), every single-model method on the smoke preset,
and every model-group method on the model-groups-digits preset (its group backbones drawn at
random: the preset's pretrained ones are an optional asset; FedDF with 200 server distillation
steps a round instead of 10^4), all in process with one thread.
``compare`` holds each run's final ``state.safetensors`` and ``allocation.json`` byte for byte,
and ``config.json`` and ``metrics.json`` as parsed JSON (key order aside) without the timings
and the process facts (``TIMINGS``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

SINGLE = ("fedra", "all-large", "all-small", "depthfl", "fedbrick", "inclusivefl")
GROUPED = ("homo", "all-large", "all-small", "fedmd", "feddf", "flexifed", "heterotune",
           "pfedlora")
BYTES = ("state.safetensors", "allocation.json")
# timings and the facts of the process a run shared with the runs before it (its pid, peak
# memory, backbone builds): any metric whose name contains one of these
TIMINGS = ("seconds", "started", "pid", "peak-rss-mb", "backbone-builds", "gpu-peak-mb")


def runs() -> dict[str, dict]:
    plans = {"main-job": {}}
    plans |= {f"smoke-{m}": {"preset": "smoke", "method": m} for m in SINGLE}
    plans |= {f"groups-{m}": {"preset": "model-groups-digits", "method": m,
                              "model-group-sources": "random"} for m in GROUPED}
    plans["groups-feddf"]["feddf-steps"] = 200  # its paper's 10^4 server steps: hours on a CPU
    return plans


def run(out: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from fedtune_app.apps.inprocess import run_inprocess

    torch.set_num_threads(1)
    scratch = Path(tempfile.gettempdir()) / "same-results"  # config.json names it: one for all
    for name, keys in runs().items():
        if (out / name).is_dir():
            continue  # resumable
        shutil.rmtree(scratch, ignore_errors=True)
        folder = run_inprocess(keys | {"results-dir": str(scratch)})
        shutil.move(folder, out / name)
        print(name, "done", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items()
                if not any(t in k for t in TIMINGS)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def compare(a: Path, b: Path) -> list[str]:
    differences = []
    for name in runs():
        for file in BYTES:
            if (a / name / file).read_bytes() != (b / name / file).read_bytes():
                differences.append(f"{name}/{file} differs")
        for file in ("config.json", "metrics.json"):
            left, right = (without_timings(json.loads((d / name / file).read_text()))
                           for d in (a, b))
            if left != right:
                differences.append(f"{name}/{file} differs")
    return differences


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "run":
        run(Path(argv[1]).resolve())
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        differences = compare(Path(argv[1]), Path(argv[2]))
        print("\n".join(differences) or f"identical: {len(runs())} runs")
        return 1 if differences else 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
