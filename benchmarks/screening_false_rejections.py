"""How often screening would reject an HONEST client: every reply of honest in-process runs is
judged by each screening rule (two defaults ago, the previous default, now), per round, on the
same trajectory (nobody is actually rejected, so every rule sees the same updates), and the
state guard's verdict on each new state too.

    OMP_NUM_THREADS=1 python benchmarks/screening_false_rejections.py \
        --jobs default,smoke --seeds 0,11,12 --alphas 0.1,0.5 --rounds 3

Per (job, alpha, seed, round, client, tensor) it records the update's rms, the global tensor's
rms, the update norm, its holders' median norm, the number of holders, the client's example
count and screening's bound of its training reach (where there is one), into
``benchmarks/results/screening_false_rejections.json``, and prints, per rule, the replies it
would reject (client x round) and the largest ratio to its bound seen.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent

import numpy as np  # noqa: E402

from common import GPU_JOB  # noqa: E402
from fedtune_app.config import RobustConfig  # noqa: E402
from fedtune_app.federated import robust, strategy  # noqa: E402

JOBS = {  # name -> run config (the data reduced where the job is long; stated in the output)
    "default": {},
    "all-large": {"method": "all-large"},
    "smoke": {"preset": "smoke", "partitioner": "dirichlet"},
    "offline-text-ratio": {"preset": "offline-text-ratio"},
    # the same with partitions of 2 examples allowed: most seeds draw no Dirichlet(0.1)
    # partition of 20 clients with 5 examples each (flwr-datasets gives up after 10 tries)
    "offline-text-ratio-min2": {"preset": "offline-text-ratio", "min-partition-size": 2},
    # ViT-B/16 from random weights on synthetic images, bf16, on a CUDA GPU (bench_simulation's)
    "vit-b-gpu": GPU_JOB["run_config"],
}
RECORDS: list[dict] = []
GUARD: list[dict] = []
CONTEXT: dict = {}


def recording_screen(updates, sent, cfg: RobustConfig, peers=True, reach=None):
    """Record every update's statistics, reject nobody (the honest trajectory)."""
    reach = reach or {}
    holders: dict[str, dict[str, float]] = {}
    rows = []
    for u in updates:
        for name, value in u.tensors.items():
            ref = sent[u.client][name]
            delta = value.astype(np.float64) - ref
            rows.append({"client": u.client, "tensor": name, "rms": robust.rms(delta),
                         "ref_rms": robust.rms(ref), "norm": robust.norm(delta),
                         "examples": int(u.num_examples),
                         "reach": reach.get(u.client, {}).get(name)})
            holders.setdefault(name, {})[u.client] = robust.norm(delta)
    for row in rows:
        norms = holders[row["tensor"]]
        row |= {"holders": len(norms), "median_norm": float(np.median(list(norms.values()))),
                **CONTEXT}
        RECORDS.append(row)
    return {}


def recording_guard(old, new, cfg: RobustConfig, check_jump=True, skip_jump=(), accepted=None):
    """Record every tensor's move and the largest accepted update; keep every state."""
    for name in sorted(new):
        if name in old and new[name] is not old[name] and name not in skip_jump:
            GUARD.append({"tensor": name, "jump": robust.rms(new[name].astype(np.float64)
                                                             - old[name]),
                          "ref_rms": robust.rms(old[name]),
                          "accepted": (accepted or {}).get(name, 0.0), **CONTEXT})
    return robust.state_problem(old, new, cfg, check_jump=False)


def growth_rule(r, cfg: RobustConfig) -> bool:
    """The screening of two defaults ago (growth bound on every tensor + peer rule)."""
    floor = cfg.screen_rms_floor
    growth = r["rms"] > cfg.screen_max_growth * max(r["ref_rms"], floor)
    peer = (r["holders"] >= 3 and r["rms"] > floor
            and r["norm"] > cfg.screen_peer_ratio * r["median_norm"])
    return growth or peer


def peer_rule(r, cfg: RobustConfig) -> bool:
    """The previous default: the peer rule with 3 or more holders, else the growth bound."""
    return bool(robust.screen_verdict(r["rms"], r["ref_rms"], r["norm"], r["median_norm"],
                                      r["holders"], cfg))


def new_rule(r, cfg: RobustConfig) -> bool:
    """``robust.screen`` as it is now (the training-reach bound where the run gave one)."""
    return bool(robust.screen_verdict(r["rms"], r["ref_rms"], r["norm"], r["median_norm"],
                                      r["holders"], cfg, reach=r.get("reach")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="default,smoke")
    parser.add_argument("--seeds", default="0,11,12")
    parser.add_argument("--alphas", default="0.1,0.5")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--extra", default="", help="run-config keys added to every job")
    parser.add_argument("--report", action="store_true",
                        help="only print the table of the runs recorded before")
    args = parser.parse_args()
    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.config import setup_logging
    from fedtune_app.federated.flower_private import parse_config_args
    from fedtune_app.methods import resolve_config

    out = ROOT / "benchmarks" / "results" / "screening_false_rejections.json"
    if args.report:
        saved = json.loads(out.read_text())
        RECORDS.extend(saved["records"])
        GUARD.extend(saved["guard"])
        report({job: resolve_config(JOBS[job]).robust for job in {r["job"] for r in RECORDS}})
        return
    setup_logging()
    strategy.screen, strategy.state_problem = recording_screen, recording_guard
    extra = parse_config_args([args.extra]) if args.extra else {}
    if out.exists():  # add to the runs recorded before (another job, more seeds)
        saved = json.loads(out.read_text())
        done = {(r["job"], r["alpha"], r["seed"]) for r in saved["records"]}
        RECORDS.extend(saved["records"])
        GUARD.extend(saved["guard"])
    else:
        done = set()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs.split(","):
            for alpha in map(float, args.alphas.split(",")):
                for seed in map(int, args.seeds.split(",")):
                    if (job, alpha, seed) in done:
                        continue
                    rc = JOBS[job] | {"seed": seed, "dirichlet-alpha": alpha,
                                      "num-server-rounds": args.rounds, "eval-every": 1000,
                                      "test-subset": 50, "results-dir": tmp} | extra
                    if resolve_config(rc).data.dirichlet_alpha != alpha:  # a preset's own
                        print(f"{job} alpha {alpha}: not run: the preset sets its own alpha",
                              flush=True)
                        continue
                    CONTEXT.clear()
                    CONTEXT.update(job=job, alpha=alpha, seed=seed)
                    before = len(RECORDS)
                    orig = strategy.LayerPlanStrategy.aggregate_train

                    def counted(self, server_round, replies, _orig=orig):
                        CONTEXT["round"] = server_round
                        return _orig(self, server_round, replies)

                    strategy.LayerPlanStrategy.aggregate_train = counted
                    try:
                        run_inprocess(rc)
                    except RuntimeError as e:  # e.g. no Dirichlet partition of this seed
                        print(f"{job} alpha {alpha} seed {seed}: not run: {e}", flush=True)
                        continue
                    finally:
                        strategy.LayerPlanStrategy.aggregate_train = orig
                    print(f"{job} alpha {alpha} seed {seed}: {len(RECORDS) - before} updates",
                          flush=True)
                    out.write_text(json.dumps({"records": RECORDS, "guard": GUARD}))
    report({job: resolve_config(JOBS[job]).robust for job in {r["job"] for r in RECORDS}})


def growth_bound(r, cfg: RobustConfig) -> float:
    return cfg.screen_max_growth * max(r["ref_rms"], cfg.screen_rms_floor)


def growth_ratio(r, cfg: RobustConfig) -> float:
    return r["rms"] / growth_bound(r, cfg)


def report(cfgs: dict[str, RobustConfig]) -> None:
    runs = sorted({(r["job"], r["alpha"], r["seed"]) for r in RECORDS})
    print(f"{len(runs)} honest runs: " + ", ".join(f"{j} a={a:g} s={s}" for j, a, s in runs))
    for name, rule in (("growth bound on every tensor (two defaults ago)", growth_rule),
                       ("peer rule (the previous default)", peer_rule), ("now", new_rule)):
        replies: dict[tuple, bool] = {}
        for r in RECORDS:
            key = (r["job"], r["alpha"], r["seed"], r["round"], r["client"])
            replies[key] = replies.get(key, False) or rule(r, cfgs[r["job"]])
        bad = sorted(k for k, v in replies.items() if v)
        runs_hit = {k[:3] for k in bad}
        print(f"{name}: {len(bad)} of {len(replies)} honest replies rejected, in "
              f"{len(runs_hit)} of {len(runs)} runs")
        by_round: dict[int, list[int]] = {}
        for k, v in replies.items():
            by_round.setdefault(k[3], [0, 0])
            by_round[k[3]][0] += v
            by_round[k[3]][1] += 1
        print("   per round: " + ", ".join(f"round {r}: {a}/{n}"
                                           for r, (a, n) in sorted(by_round.items())))
        for k in bad:
            print("   ", k)
    worst = max(RECORDS, key=lambda r: growth_ratio(r, cfgs[r["job"]]))
    print(f"largest rms / growth bound: {growth_ratio(worst, cfgs[worst['job']]):.2f} "
          f"({worst['tensor']}, {worst['holders']} holders)")
    if few := [r for r in RECORDS if r["holders"] < 3]:
        worst = max(few, key=lambda r: growth_ratio(r, cfgs[r["job"]]))
        print(f"largest rms / growth bound with 1-2 holders: "
              f"{growth_ratio(worst, cfgs[worst['job']]):.3f} ({worst['tensor']})")
    if peers := [r for r in RECORDS if r["holders"] >= 3
                 and r["rms"] > cfgs[r["job"]].screen_rms_floor]:
        worst = max(peers, key=lambda r: r["norm"] / r["median_norm"])
        print(f"largest norm / holders' median (above the floor, >= 3 holders): "
              f"{worst['norm'] / worst['median_norm']:.2f} ({worst['tensor']}) against "
              f"{cfgs[worst['job']].screen_peer_ratio:g}")
    if reached := [r for r in RECORDS if r.get("reach") is not None]:
        worst = max(reached, key=lambda r: r["norm"] / r["reach"])
        print(f"largest norm / training reach: {worst['norm'] / worst['reach']:.3f} "
              f"({worst['tensor']}, {len(reached)} updates with a reach bound)")
    bound = lambda g: growth_bound(g, cfgs[g["job"]])  # noqa: E731
    kept_old = sum(g["jump"] > bound(g) for g in GUARD)
    kept_new = sum(g["jump"] > max(bound(g), g.get("accepted", 0.0)) for g in GUARD)
    print(f"state guard: tensors over the previous bound {kept_old}, over today's {kept_new} "
          f"(of {len(GUARD)} tensor moves)")


if __name__ == "__main__":
    main()
