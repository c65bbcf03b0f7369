"""What `fedtune claims run --jobs N` saves: the same claim runs, one at a time in this process
and N at a time in worker processes (one torch thread each either way), each into a fresh
record store; the wall seconds of both, their ratio (N is the most it can be, on N idle cores)
and whether the two stored the same test results, run by run.

The runs are a claim's arms on a few seeds, cut to a few rounds, at the papers' rate 0.01 (so no
tuning runs are needed). Run it on an otherwise idle machine with at least N cores:

    python benchmarks/bench_claims_jobs.py fedra-t1-vs-allsmall --tier mini --seeds 2 --rounds 10
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from common import save, table


def campaign(claims: list[str], tier: str, seeds: int, rounds: int, jobs: int,
             folder: Path) -> tuple[float, list[dict]]:
    from fedtune_app.claims.execution import run_claims

    started = time.perf_counter()
    records = run_claims(claims, tier, seeds, folder / "runs", folder / "results", log=print,
                         extra={"num-server-rounds": rounds, "eval-every": rounds},
                         lr_mode="paper", jobs=jobs)
    return time.perf_counter() - started, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("claims", nargs="+", help="claim ids or globs")
    parser.add_argument("--tier", default="mini")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the serial campaign gets one core per run, as each worker does
    with tempfile.TemporaryDirectory() as tmp:
        serial_s, serial = campaign(args.claims, args.tier, args.seeds, args.rounds, 1,
                                    Path(tmp) / "one")
        parallel_s, parallel = campaign(args.claims, args.tier, args.seeds, args.rounds,
                                        args.jobs, Path(tmp) / "many")
    same = [a["test-correct"] == b["test-correct"] for a, b in zip(serial, parallel)]
    row = {"runs": len(serial), "rounds": args.rounds, "one at a time s": serial_s,
           f"{args.jobs} at a time s": parallel_s, "speed-up": serial_s / parallel_s,
           "runs with equal test results": f"{sum(same)}/{len(same)}"}
    text = table(f"claims --jobs {args.jobs}, tier {args.tier}: {' '.join(args.claims)}", [row])
    path = save(f"claims_jobs_{args.tier}", {"args": vars(args), "row": row, "table": text})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
