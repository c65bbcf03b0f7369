"""(f) What the LoRA-rank methods cost: bytes per client per round, down (server -> client) and
up (client -> server), and the server's aggregation time per round, each as a ratio to FedIT
(plain FedAvg of A and B) measured in the same run.

Every method runs the smoke preset in this process (``run_inprocess``: the real ServerApp,
strategy and ClientApp, no Ray) with the same seed, clients of mixed rank ('ranks', 'lora-r')
and FedRA's allocation. Bytes are the run's own ``bytes-down`` / ``bytes-up`` (metrics.json:
the ArrayRecords sent and the accepted replies) over the clients of each round. Server time is
the strategy's ``aggregate`` (the method's aggregation rule on the decoded replies: FlexLoRA's
SVD, FLoRA's stacking and merge, HetLoRA's norms), timed around the call, median over rounds.
FLoRA runs again with twice the clients to show how its download scales with them.

    python benchmarks/bench_rank.py                        # ranks 4,2,1 at lora-r 4, 4 rounds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from common import save, table
from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.methods import METHODS
from fedtune_app.methods.lora_ranks import lora_modules

METHODS_COMPARED = ["fedit", "ffa-lora", "fedsa-lora", "fedex-lora", "flora", "flexlora",
                    "hetlora"]


REPEATS = 20  # a smoke aggregation takes about a millisecond: the fastest of 20 calls


@contextlib.contextmanager
def timed_aggregation(method: str, seconds: list, strategies: list):
    """Time the method's ``aggregate`` (its own class's, so a ``super()`` call inside is not
    counted twice): the fastest of ``REPEATS`` calls on the round's replies, which must all
    give the same new state (the rule is a function of the state and the replies; the run goes
    on with it). Keeps the strategy for its shapes."""
    cls = METHODS[method].strategy
    original, own = cls.aggregate, "aggregate" in vars(cls)

    def aggregate(self, updates):
        strategies.append(self)
        times, results = [], []
        for _ in range(REPEATS):
            start = time.perf_counter()
            results.append(original(self, updates))
            times.append(time.perf_counter() - start)
        first, last = results[0], results[-1]
        if first.keys() != last.keys() or any(not np.array_equal(first[n], last[n])
                                              for n in first):
            raise RuntimeError(f"{method}'s aggregate is not repeatable: cannot time it this way")
        seconds.append(min(times))
        return first

    cls.aggregate = aggregate
    try:
        yield
    finally:
        if own:
            cls.aggregate = original
        else:  # inherited (FedIT's is the base rule): inherit it again
            del cls.aggregate


def measure(method: str, run_config: dict) -> dict:
    seconds, strategies = [], []
    with tempfile.TemporaryDirectory() as tmp, timed_aggregation(method, seconds, strategies):
        folder = run_inprocess({**run_config, "method": method, "results-dir": tmp})
        rounds = json.loads((Path(folder) / "metrics.json").read_text())
    n = [len(r["clients"]) for r in rounds]
    return {"down": statistics.mean(r["bytes-down"] / k for r, k in zip(rounds, n)),
            "up": statistics.mean(r["bytes-up"] / k for r, k in zip(rounds, n)),
            "server s": statistics.median(seconds),
            "accuracy": rounds[-1]["accuracy"], "strategy": strategies[-1]}


def stacked_download(strategy, ranks: list[int]) -> tuple[int, int]:
    """FLoRA's merge payload per client per round if the client held every block, computed
    from the shapes in float32: (the stacked factors of all clients, sum_i r_i (d_in + d_out)
    per adapted Linear, as the official code sends them; the merged d_out x d_in delta, as
    fedtune sends it, whatever the number of clients)."""
    stack = delta = 0
    for module in lora_modules(strategy.state):
        d_in = strategy.state[module + ".lora_A.weight"].shape[1]
        d_out = strategy.state[module + ".lora_B.weight"].shape[0]
        stack += 4 * sum(ranks) * (d_in + d_out)
        delta += 4 * d_out * d_in
    return stack, delta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="4,2,1")
    parser.add_argument("--lora-r", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=METHODS_COMPARED, choices=METHODS_COMPARED)
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    base = {"preset": "smoke", "ranks": args.ranks, "lora-r": args.lora_r,
            "lora-alpha": 2.0 * args.lora_r, "num-server-rounds": args.rounds, "seed": 0,
            # depths as in the smoke preset: 4, 2, 1 blocks, repeated
            "capacities": ",".join("421"[i % 3] for i in range(len(ranks)))}
    results = {m: measure(m, base) for m in ["fedit", *[m for m in args.methods if m != "fedit"]]}
    ref = results["fedit"]
    rows = [{"method": m, "down B/client": round(r["down"]),
             "down / FedIT": r["down"] / ref["down"],
             "up B/client": round(r["up"]), "up / FedIT": r["up"] / ref["up"],
             "server ms": 1e3 * r["server s"], "server / FedIT": r["server s"] / ref["server s"],
             "final acc": r["accuracy"]} for m, r in results.items()]
    texts = [table(f"LoRA-rank methods, smoke preset, ranks {args.ranks} at lora-r {args.lora_r}, "
                   f"{args.rounds} rounds, per client per round (ratios to FedIT, same run)", rows)]
    # FLoRA with twice the clients (ranks and depths repeated): fedtune's download per client
    twice = {**base, "ranks": ",".join([args.ranks] * 2),
             "capacities": ",".join([base["capacities"]] * 2)}
    flora2 = measure("flora", twice)
    fedit2 = measure("fedit", twice)
    flora1 = results.get("flora") or measure("flora", base)
    scaling = []
    for rc, fl, fi in ((base, flora1, ref), (twice, flora2, fedit2)):
        rk = [int(r) for r in rc["ranks"].split(",")]
        stack, delta = stacked_download(fl["strategy"], rk)
        scaling.append({"clients": len(rk), "flora down B/client": round(fl["down"]),
                        "fedit down B/client": round(fi["down"]),
                        "flora / fedit": fl["down"] / fi["down"],
                        "official stack B (all blocks)": stack,
                        "merged delta B (all blocks)": delta})
    texts.append(table("FLoRA's download per client per round as the clients double (measured: "
                       "flora/fedit down; computed from the shapes: the official stacked factors "
                       "vs fedtune's merged delta, every block held)", scaling))
    for r in results.values():
        r.pop("strategy")
    for r in (flora1, flora2, fedit2):
        r.pop("strategy", None)
    path = save("rank", {"args": vars(args), "run-config": base, "methods": results,
                         "flora-x2": flora2, "fedit-x2": fedit2, "table": texts})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
