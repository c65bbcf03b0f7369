"""(b) Layer scaling: seconds per client training step for capacities 0..L.

The client's real path (cached backbone with adapters, ``subnetwork(plan)``, ``train_local``)
on the job's data, batch size and sequence length. Capacity 0 runs only the stem and head: the
fixed cost t0. Ideal step time for L_i layers: t0 + (L_i / L) * (t_L - t0).

    python benchmarks/bench_layers.py                # default (MiniLM) and smoke (Mixer)
    python benchmarks/bench_layers.py --jobs smoke --steps 4 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch  # noqa: E402

from common import save, table
from fedtune_app.apps.client import runtime  # noqa: E402
from fedtune_app.config import app_defaults  # noqa: E402
from fedtune_app.data.splits import run_splits
from fedtune_app.methods import resolve_config  # noqa: E402
from fedtune_app.model.adapters import trainable_parameters  # noqa: E402
from fedtune_app.model.block_store import hold_blocks  # noqa: E402
from fedtune_app.training.local import train_local  # noqa: E402

JOBS = {"default": {}, "smoke": {"preset": "smoke"}}


def step_seconds(model, plan, data, cfg, device, steps: int, repeats: int) -> float:
    hold_blocks(model, plan)  # as a client does before training its plan
    sub = model.subnetwork(plan)
    params = list(trainable_parameters(sub).values())
    times = []
    for rep in range(repeats + 1):  # the first pass warms up
        started = time.perf_counter()
        train_local(sub, params, data, cfg.training, seed=rep, device=device)
        times.append((time.perf_counter() - started) / steps)
    return statistics.median(times[1:])


def measure(job: str, steps: int, repeats: int) -> dict:
    cfg = resolve_config({**app_defaults(), **JOBS[job]})
    model, device = runtime(cfg)
    data = run_splits(cfg).train
    data = data.subset(range(min(len(data), steps * cfg.training.batch_size)))
    steps = -(-len(data) // cfg.training.batch_size)
    L = model.num_blocks
    t = [step_seconds(model, tuple(range(k)), data, cfg, device, steps, repeats)
         for k in range(L + 1)]
    rows = []
    for k in range(1, L + 1):
        ideal = t[0] + k / L * (t[L] - t[0])
        rows.append({"layers": k, "share k/L": k / L, "step s": t[k], "ideal s": ideal,
                     "measured/ideal": t[k] / ideal, "t_k/t_L": t[k] / t[L]})
    return {"model": cfg.model.model, "blocks": L, "batch-size": cfg.training.batch_size,
            "steps": steps, "repeats": repeats, "fixed-seconds": t[0],
            "fixed-share": t[0] / t[L], "rows": rows,
            "max-deviation": max(abs(r["measured/ideal"] - 1) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", default=["default", "smoke"], choices=JOBS)
    parser.add_argument("--steps", type=int, default=8, help="training steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0 = torch's default; a 1-CPU Ray actor uses 1)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results, texts = {}, []
    for job in args.jobs:
        res = results[job] = measure(job, args.steps, args.repeats)
        texts.append(table(
            f"Layer scaling, {res['model']} ({res['blocks']} blocks, batch {res['batch-size']}, "
            f"{torch.get_num_threads()} threads): fixed stem+head cost "
            f"{res['fixed-seconds']:.4f} s "
            f"= {res['fixed-share']:.0%} of a full step; largest deviation from ideal "
            f"{res['max-deviation']:.0%}", res["rows"]))
    name = "layers" + (f"-{args.threads}thread" if args.threads else "")
    print(f"\nwrote {save(name, {'args': vars(args), 'jobs': results, 'table': texts})}")


if __name__ == "__main__":
    main()
