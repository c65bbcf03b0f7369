"""How far a re-pretrained stand-in moves a tuning run: committed tuning records run again here.

    python scripts/backbone_effect.py SETTING LR ARM [ARM ...]

The stand-in backbones are deterministic on one machine, not across CPUs, and the mini tier's
base-grid tuning records (LR_GRID) loaded files that no longer exist, while rule v3's widening
runs its new rungs on the files committed in docs/claims/backbones/. This runs each ARM of
SETTING at LR on the tuning seeds with this machine's files into a scratch store (the committed
records are left alone) and writes, per arm, the stored and the new validation metric (the
primary: mean of the last three evaluations, points) to
docs/claims/tuning/backbone-effect.json, so the report can say how large the backbone's share
of a widened comparison is.
"""

import json
import sys
import tempfile
from pathlib import Path

import torch

from fedtune_app.claims import registry as reg
from fedtune_app.claims.execution import execute
from fedtune_app.claims.store import STORE, RunSpec, find_cached, primary_points, tuning_config
from fedtune_app.tools.pretrain import checkpoint_digests

OUT = STORE / "tuning" / "backbone-effect.json"


def main(argv: list[str]) -> None:
    from fedtune_app.methods import resolve_config

    torch.set_num_threads(1)
    setting, lr, arms = argv[0], float(argv[1]), argv[2:]
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    with tempfile.TemporaryDirectory() as scratch:
        for arm in arms:
            pairs = []
            for seed in reg.TUNING_SEEDS:
                spec = RunSpec("mini", setting, arm, seed,
                               tuning_config("mini", setting, arm, seed, lr), "tuning")
                stored = find_cached(spec, STORE)
                if stored is None:
                    raise SystemExit(f"no committed tuning record of {spec.name}")
                new = execute(spec, Path(scratch) / "results", Path(scratch) / "store")
                pairs.append((primary_points(stored), primary_points(new)))
            stored_mean = sum(p[0] for p in pairs) / len(pairs)
            new_mean = sum(p[1] for p in pairs) / len(pairs)
            results[f"{setting} {arm} lr {lr:g}"] = {
                "seeds": list(reg.TUNING_SEEDS), "stored": [p[0] for p in pairs],
                "here": [p[1] for p in pairs], "here-minus-stored": new_mean - stored_mean,
                "checkpoints-here": checkpoint_digests(resolve_config(spec.keys))}
            print(f"{setting} {arm} lr {lr:g}: stored {stored_mean:.2f}, here {new_mean:.2f} "
                  f"({new_mean - stored_mean:+.2f} points)")
            OUT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
