"""The owner test of the label-skew (``cpu``) tier: why InclusiveFL collapses there.

Under Dirichlet label skew the one client that holds every block is the only one that trains
the deepest block, so the full-depth model learns its labels. The test (``OWNER_TEST`` in the
registry): seed 4 of ``fedra-uneven``, InclusiveFL, once as the tier runs it (capacities
6,5,4,3,2,2: client 0 holds all 6 blocks) and once with the 6 blocks given to a client that
holds every class (client 5: capacities 2,5,4,3,2,6); per class accuracy and each client's
labels beside the curves. It runs in this process (``run_inprocess``): no Ray start-up, no
SuperLink, the same ServerApp and ClientApp.

    python -m fedtune_app.claims.owner     (two runs of a few minutes on one thread)

writes ``docs/claims/label-skew-owner-test.json``, which ``fedtune claims report`` shows.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fedtune_app.claims.registry import ARMS, OWNER_TEST


def owner_test(out: Path | None = None, results: Path | None = None) -> dict:
    """Run both arrangements in this process; the summary written to ``out``."""
    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.apps.results import write_json
    from fedtune_app.claims import store
    from fedtune_app.tools.fingerprint import code_fingerprint

    out = out or store.STORE / "label-skew-owner-test.json"
    results = results or store.RESULTS / "owner-test"
    setting, arm, seed = OWNER_TEST["setting"], OWNER_TEST["arm"], OWNER_TEST["seed"]
    summary = {"setting": setting, "arm": arm, "seed": seed, "commit": store.git_commit(),
               "fingerprint": code_fingerprint(ARMS[arm].method), "runs": []}
    for label, capacities in OWNER_TEST["arrangements"].items():
        keys = store.run_config("cpu", setting, arm, seed) | {"capacities": capacities}
        started = time.time()
        folder = Path(run_inprocess(keys | {"results-dir": str(results)}))
        metrics = json.loads((folder / "metrics.json").read_text())
        config = json.loads((folder / "config.json").read_text())
        evaluated = [m for m in metrics if m["accuracy"] is not None]
        peak = max(evaluated, key=lambda m: m["accuracy"])
        summary["runs"].append({
            "arrangement": label, "capacities": capacities,
            "config-hash": store.config_hash(keys), "seconds": round(time.time() - started, 1),
            "class-names": config["class-names"],
            "client-labels": {str(c["partition_id"]): c["label_counts"]
                              for c in config["clients"]},
            "curve": [(m["round"], m["accuracy"]) for m in evaluated],
            "final": evaluated[-1]["accuracy"], "peak": peak["accuracy"],
            "peak-round": peak["round"],
            "final-per-class": evaluated[-1]["accuracy-per-class"],
            "peak-per-class": peak["accuracy-per-class"]})
    write_json(out, summary)
    return summary


if __name__ == "__main__":
    from fedtune_app.config import setup_logging

    setup_logging()
    print(json.dumps(owner_test(*map(Path, sys.argv[1:2])), indent=1)[:4000])
