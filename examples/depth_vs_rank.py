"""Layers or rank? Two arms with the same trainable LoRA parameters per client, paired by seed.

A device can spend a LoRA budget on depth (more blocks, lower rank) or on width (fewer blocks,
higher rank). Both arms run FedIT (FedAvg of A and B per rank component) with FedRA's random
allocation of blocks, on the smoke preset's tiny random-init MLP-Mixer widened to 6 blocks,
three clients, the same seeds (a seed fixes the split, the allocation draws and the initial
adapters), the same global rank 'lora-r' = 4 and scale alpha / r:

    layers: every client holds 6 blocks at rank 2   (12 rank-blocks)
    rank:   every client holds 3 blocks at rank 4   (12 rank-blocks)

It prints each arm's final accuracy per seed, the trainable parameters per client (from the
runs' metrics.json), and the paired difference layers - rank with a two-sided 95% t interval
over the seeds (scipy). Three seeds on a tiny setting: an illustration, not a claim.

    python examples/depth_vs_rank.py --seeds 0,1,2 --out results/depth-vs-rank
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scipy import stats

from fedtune_app.apps.inprocess import run_inprocess

COMMON = {"preset": "smoke", "method": "fedit", "lora-r": 4, "lora-alpha": 8.0,
          "model-args": "img_size=8,patch_size=2,in_chans=1,embed_dim=32,num_blocks=6",
          "num-server-rounds": 10, "train-subset": 600, "test-subset": 300}
ARMS = {"layers": {"capacities": "6,6,6", "ranks": "2,2,2"},
        "rank": {"capacities": "3,3,3", "ranks": "4,4,4"}}


def t_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the paired differences: mean -+ t_{n-1} sd / sqrt(n)."""
    n, mean = len(diffs), statistics.mean(diffs)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(diffs) / n ** 0.5
    return mean, mean - half, mean + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="results/depth-vs-rank")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    acc = {arm: [] for arm in ARMS}
    params = {}
    for arm, keys in ARMS.items():
        for seed in seeds:
            folder = run_inprocess({**COMMON, **keys, "seed": seed,
                                    "results-dir": f"{args.out}/{arm}"})
            metrics = json.loads((Path(folder) / "metrics.json").read_text())
            acc[arm].append(metrics[-1]["accuracy"])
            params[arm] = sorted(set(metrics[-1]["trainable-params"].values()))
    diffs = [a - b for a, b in zip(acc["layers"], acc["rank"])]
    mean, low, high = t_interval(diffs)
    lines = [f"{arm}: {ARMS[arm]['capacities'].split(',')[0]} blocks x rank "
             f"{ARMS[arm]['ranks'].split(',')[0]}, trainable params per client {params[arm]}, "
             f"final accuracy per seed {acc[arm]}, mean {statistics.mean(acc[arm]):.3f}"
             for arm in ARMS]
    lines.append(f"layers - rank, paired over seeds {seeds}: {mean:+.3f}, 95% t interval "
                 f"[{low:+.3f}, {high:+.3f}]")
    print("\n".join(lines))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "depth-vs-rank.json").write_text(json.dumps(
        {"common": COMMON, "arms": ARMS, "seeds": seeds, "accuracy": acc, "params": params,
         "difference": {"mean": mean, "low": low, "high": high}}, indent=1))


if __name__ == "__main__":
    main()
