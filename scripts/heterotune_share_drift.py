"""How far HeteroTune's share-adapters move from their start in a pooled claim run.

    python scripts/heterotune_share_drift.py [SEED]

Runs the committed confirmatory record of ``heterotune-pooled`` / ``heterotune`` on SEED
(default 200) again from its run key, once with cross-model sharing (HeteroTune) and once with
``heterotune-sharing = within-group`` (adapter-Homo), keeping the last round's server state,
and prints, over every share-adapter tensor S (r x r, started at the identity), the relative
move ||S - I||_F / ||I||_F (median and largest) and the branch weights a_i (started at 1/M).
Cross-model sharing can only carry what the share-adapters learn: when they barely move, the
two arms are the same model up to that move. About 200 s of one core per arm.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors import safe_open

from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.claims.store import STORE
from fedtune_app.methods.heterotune import SHARE


def share_drift(run_key: dict, sharing: str, results: Path) -> dict:
    folder = Path(run_inprocess(run_key | {"heterotune-sharing": sharing,
                                           "checkpoint-every": run_key["num-server-rounds"],
                                           "results-dir": str(results / sharing)}))
    with safe_open(str(folder / "checkpoint.safetensors"), "np") as f:
        state = {n.removeprefix("state/"): f.get_tensor(n) for n in f.keys()
                 if n.startswith("state/")}
    moves = [np.linalg.norm(v - np.eye(len(v))) / np.sqrt(len(v))
             for n, v in state.items() if SHARE in n]
    branches = np.stack([v for n, v in state.items() if n.endswith(".adapter.branch")])
    return {"share-tensors": len(moves), "median-move": float(np.median(moves)),
            "largest-move": float(max(moves)),
            "branch-weight-mean": [round(float(x), 4) for x in branches.mean(0)],
            "branch-weight-range": [float(branches.min()), float(branches.max())]}


def main(argv: list[str]) -> None:
    seed = int(argv[0]) if argv else 200
    [path] = (STORE / "runs" / "mini").glob(f"heterotune-pooled__heterotune__seed{seed}__*.json")
    run_key = json.loads(path.read_text())["run-key"]
    with tempfile.TemporaryDirectory() as scratch:
        for sharing in ("cross-model", "within-group"):
            print(sharing, json.dumps(share_drift(run_key, sharing, Path(scratch))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
