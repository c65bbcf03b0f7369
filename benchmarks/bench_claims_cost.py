"""What a claims campaign costs on this machine: each distinct (setting, arm) of a tier's claims
run for three rounds (seed 0), timed round by round, and projected to its full run.

Each run goes through ``run_inprocess`` (the real ServerApp and ClientApp, as ``fedtune claims
run`` does) in its own process with a wall-clock limit, so a slow arm is reported as such and
the others still run. Rounds 1-2 train without evaluating, round 3 trains and evaluates:

    setup   = round 1 - round 2   (imports, model build, data, first CUDA kernels)
    train   = round 2             (one round of training and aggregation)
    eval    = round 3 - round 2   (one evaluation of the global model(s))
    run     = setup + N * train * E / E_measured + ceil(N / eval-every) * eval

N, eval-every and E (local epochs) are the arm's own; ``--local-epochs`` measures fewer epochs
(E_measured) and scales the round by E / E_measured, which over-counts server-side work that
does not grow with the epochs (FedBRICK's, FedMD's and FedDF's). ``--random-weights`` builds the
same architectures from their configs without reading weights (compute is the same; accuracy
is meaningless): for a machine that has the configs and tokenizers but not the weight files.

    python benchmarks/bench_claims_cost.py --tier gpu 'fedra-t1-*' --random-weights
    python benchmarks/bench_claims_cost.py --tier cpu 'fedra-t1-vs-allsmall' --limit 300
    python benchmarks/bench_claims_cost.py --tier mini heterotune-pooled-t1-vs-feddf \
        --arms feddf-paper --lr paper
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter

import torch

from common import ROOT, save, table
from fedtune_app.claims.store import LR_MODES

ROUNDS = 3


def measure_one(keys: dict) -> dict:
    """Run ``keys`` for ROUNDS rounds in this process; the seconds of each round."""
    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.apps.results import round_listener

    stamps = [time.perf_counter()]
    with round_listener(lambda cfg, record: stamps.append(time.perf_counter())):
        run_inprocess(keys)
    rounds = [b - a for a, b in zip(stamps, stamps[1:])]
    out = {"rounds": rounds}
    if torch.cuda.is_available():
        out["peak-gpu-gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def project(spec_keys: dict, measured_epochs: int, rounds: list[float]) -> dict:
    from fedtune_app.methods import resolve_config

    cfg = resolve_config(spec_keys)
    n, every = cfg.federation.num_server_rounds, cfg.federation.eval_every
    epochs = cfg.training.local_epochs
    setup, train, evaluate = rounds[0] - rounds[1], rounds[1], max(rounds[2] - rounds[1], 0.0)
    train_full = train * epochs / measured_epochs
    total = setup + n * train_full + math.ceil(n / every) * evaluate
    return {"setup s": setup, "round s": train_full, "eval s": evaluate, "rounds": n,
            "run s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("claims", nargs="*", help="claim ids or globs (default: all of the tier)")
    parser.add_argument("--tier", default="gpu")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per claim (default: each "
                        "claim's own) for the campaign total")
    parser.add_argument("--arms", default="", help="only these arms (labels, comma-separated)")
    parser.add_argument("--local-epochs", type=int, default=0,
                        help="measure at most this many local epochs and scale (0 = the arm's)")
    parser.add_argument("--lr", choices=LR_MODES, default="tuned",
                        help="each arm's tuned rate, or the papers' 0.01 for arms not tuned yet "
                        "(a round's cost hardly depends on the rate)")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--limit", type=float, default=600, help="seconds per measured run")
    parser.add_argument("--name", default="", help="results file name (default "
                        "claims_cost_<tier>)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # JSON keys: measure this run, print
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(measure_one(json.loads(args.one))), flush=True)
        return

    from fedtune_app.claims.planning import plan_runs

    arms = [a for a in args.arms.split(",") if a]
    specs = plan_runs(args.claims, args.tier, args.seeds, arms=arms or None, lr_mode=args.lr)
    runs_per_pair = Counter((s.setting, s.arm) for s in specs)
    seed0 = [s for s in specs if s.seed == 0]
    if arms:  # measured in the order given (the first ones matter most under a time limit)
        seed0.sort(key=lambda s: arms.index(s.arm))
    rows, campaign = [], 0.0
    for spec in seed0:
        keys = dict(spec.keys) | {"num-server-rounds": ROUNDS, "eval-every": ROUNDS,
                                  "results-dir": str(ROOT / "results" / "bench-claims-cost")}
        epochs = int(keys.get("local-epochs", 1))
        measured_epochs = min(epochs, args.local_epochs) if args.local_epochs else epochs
        keys["local-epochs"] = measured_epochs
        if args.random_weights:
            keys["model-source"] = "random"
            if keys.get("model-groups"):
                keys["model-group-sources"] = "random"
        row = {"setting": spec.setting, "arm": spec.arm, "epochs measured": measured_epochs}
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, __file__, "--one", json.dumps(keys)],
                                  capture_output=True, text=True, timeout=args.limit,
                                  cwd=ROOT / "benchmarks", env=os.environ)
            found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if not found:
                raise RuntimeError((done.stderr or done.stdout).strip()[-600:])
            result = json.loads(found[-1][len("RESULT "):])
            row |= project(spec.keys, measured_epochs, result["rounds"])
            row["peak GPU GB"] = result.get("peak-gpu-gb", 0.0)
            row["runs"] = runs_per_pair[spec.setting, spec.arm]
            campaign += row["run s"] * row["runs"]
        except subprocess.TimeoutExpired:
            row["error"] = f"over {args.limit:.0f} s for {ROUNDS} rounds"
        except RuntimeError as err:
            row["error"] = str(err)
        row["measured s"] = time.perf_counter() - started
        rows.append(row)
        print(json.dumps(row), flush=True)
    ok = [r for r in rows if "error" not in r]
    if ok:
        table(f"claims cost, tier {args.tier} (projected from {ROUNDS} rounds)",
              [{k: r[k] for k in ("setting", "arm", "epochs measured", "setup s", "round s",
                                  "eval s", "rounds", "run s", "runs", "peak GPU GB")}
               for r in ok])
    for r in rows:
        if "error" in r:
            print(f"{r['setting']} {r['arm']}: not measured: {r['error']}")
    print(f"campaign (measured arms, every seed): {campaign / 3600:.2f} hours")
    save(args.name or f"claims_cost_{args.tier}",
         {"claims": args.claims, "random-weights": args.random_weights,
          "local-epochs": args.local_epochs, "rows": rows, "campaign-hours": campaign / 3600})


if __name__ == "__main__":
    main()
