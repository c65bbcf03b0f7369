"""The batched client engine against the sequential one: the same rounds, both ways, one process.

A sequential in-process federation of the `mini` FedRA Table 1 setting (conf/mini.toml: 12-block
ViT of width 32, six clients holding 12,10,8,6,4,3 blocks, 300 digits each, batch 32) runs
``--rounds`` rounds and keeps every round's train messages. Each round's messages are then
trained again both ways on fresh node contexts: one after another by ``client.handle_train``
(the sequential engine), and as one cohort by ``client.handle_train_cohort`` (the batched
engine), alternating which goes first, ``--repeats`` times. It prints each round's best time of
each way and, last,

    round batched / sequential: R; max relative update difference: D

R: the sum over the rounds of the batched engine's best time over the sequential engine's
(client training and the replies; the server's work is the same either way and not timed), in
CPU time of the one thread that trains (``time.thread_time``): on a machine shared with other
work the wall clock also counts the turns of other processes, which swung the wall-clock ratio
between 0.67 and 0.83 from one run to the next on a loaded 2-core machine. The wall-clock
ratio is printed too.
D: over every client and tensor, max |batched - sequential| / max |sequential - sent|.

    OMP_NUM_THREADS=1 python benchmarks/bench_batched_clients.py            # one CPU thread
    python benchmarks/bench_batched_clients.py --threads 2 --rounds 3 --repeats 5

The `mini` backbone is pretrained by `python -m fedtune_app.tools.pretrain --family vit12-s`;
when that checkpoint is missing the same architecture runs from a random initialisation (the
time of a step does not depend on the weights' values) and the output says so.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import save
from fedtune_app.apps import client
from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
from fedtune_app.apps.server import run_federation
from fedtune_app.config import load_preset
from fedtune_app.federated.records import from_record
from fedtune_app.methods import resolve_config

MINI_FEDRA_T1 = {"preset": "mini", "method": "fedra", "capacities": "12,10,8,6,4,3",
                 "eval-every": 1000}


def setting(rounds: int, results: str, method: str = "fedra") -> tuple[dict, str]:
    """The run config, and where its backbone comes from."""
    rc = MINI_FEDRA_T1 | {"method": method, "num-server-rounds": rounds, "results-dir": results}
    source = Path(load_preset("mini")["model-source"]).expanduser()
    if source.is_file():
        return rc, f"pretrained checkpoint {source}"
    return rc | {"model-source": "random"}, (f"random init (no {source}; make it with `python "
                                              "-m fedtune_app.tools.pretrain --family vit12-s`)")


def recorded_rounds(rc: dict) -> list[list[tuple]]:
    """A sequential federation; per round, (message, node config) of each train message."""
    cfg = resolve_config(rc)
    nodes = simulation_nodes(len(cfg.federation.capacity_list))
    rounds: dict[int, list] = {}

    def keep(msg, reply):
        if msg.metadata.message_type == "train":
            rounds.setdefault(int(msg.metadata.group_id), []).append(msg)
        return reply

    grid = InProcessGrid(client_app, nodes, rc, {i: keep for i in range(len(nodes))},
                         keep_sent=False)
    run_federation(grid, cfg)
    return [[(m, grid.contexts[m.metadata.dst_node_id].node_config) for m in rounds[r]]
            for r in sorted(rounds)]


def contexts(rc: dict, items) -> list[tuple]:
    from flwr.app import Context, RecordDict

    return [(m, Context(run_id=7, node_id=m.metadata.dst_node_id, node_config=dict(nc),
                        state=RecordDict(), run_config=dict(rc))) for m, nc in items]


class Clock:
    """Wall time and this thread's CPU time of a block (``with Clock() as c: ...``)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.thread_time() - self.cpu


def sequential(rc, items) -> tuple[Clock, list]:
    pairs = contexts(rc, items)
    with Clock() as clock:
        replies = [client.handle_train(m, c) for m, c in pairs]
    return clock, replies


def batched(rc, items) -> tuple[Clock, list]:
    pairs = contexts(rc, items)
    with Clock() as clock:
        replies = client.handle_train_cohort(pairs)
    if sorted(replies) != list(range(len(pairs))):
        raise SystemExit(f"the batched engine left {len(pairs) - len(replies)} clients to the "
                         "sequential one: nothing to compare")
    return clock, [replies[k] for k in range(len(pairs))]


def difference(items, ours, theirs) -> float:
    worst = 0.0
    for (msg, _), a, b in zip(items, ours, theirs):
        sent = from_record(msg.content["arrays"])
        ta, tb = from_record(a.content["arrays"]), from_record(b.content["arrays"])
        for name, value in tb.items():
            moved = float(np.abs(value - sent[name]).max()) if name in sent else 0.0
            diff = float(np.abs(ta[name] - value).max())
            worst = max(worst, diff / moved if moved else (0.0 if diff == 0 else float("inf")))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--method", default="fedra", help="another method of the same setting "
                        "(all-large: every client all 12 blocks)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rc, source = setting(args.rounds, tmp, args.method)
        print(f"mini FedRA Table 1 setting, method {args.method}, backbone: {source}; torch "
              f"threads {args.threads}; load average {os.getloadavg()[0]:.2f}")
        rounds = recorded_rounds(rc)
    sequential(rc, rounds[0])  # warm-up: both ways build the same cached model and data
    batched(rc, rounds[0])
    totals = {"sequential": [0.0, 0.0], "batched": [0.0, 0.0]}  # (wall, cpu) seconds
    worst, rows = 0.0, []
    for r, items in enumerate(rounds, 1):
        clocks: dict[str, list[Clock]] = {"sequential": [], "batched": []}
        replies = {}
        for k in range(args.repeats):
            for way in (sequential, batched) if k % 2 == 0 else (batched, sequential):
                clock, replies[way.__name__] = way(rc, items)
                clocks[way.__name__].append(clock)
        worst = max(worst, difference(items, replies["batched"], replies["sequential"]))
        best = {name: (min(c.wall for c in cs), min(c.cpu for c in cs))
                for name, cs in clocks.items()}
        for name, (wall, cpu) in best.items():
            totals[name][0] += wall
            totals[name][1] += cpu
        rows.append({"round": r, "clients": len(items),
                     **{f"{n}-{kind}-s": v for n, b in best.items()
                        for kind, v in zip(("wall", "cpu"), b)}})
        (sw, sc), (bw, bc) = best["sequential"], best["batched"]
        print(f"round {r}: {len(items)} clients; sequential {sc:.3f} s CPU ({sw:.3f} s wall), "
              f"batched {bc:.3f} s CPU ({bw:.3f} s wall); ratio {bc / sc:.3f} CPU, "
              f"{bw / sw:.3f} wall")
    wall = totals["batched"][0] / totals["sequential"][0]
    ratio = totals["batched"][1] / totals["sequential"][1]
    save(f"batched-clients-{args.method}", {"setting": rc, "backbone": source,
                             "threads": args.threads, "rounds": rows, "ratio-cpu": ratio,
                             "ratio-wall": wall, "max-relative-update-difference": worst})
    print(f"wall-clock ratio {wall:.3f} (load average now {os.getloadavg()[0]:.2f})")
    print(f"round batched / sequential: {ratio:.3f}; max relative update difference: {worst:.2e}")


if __name__ == "__main__":
    main()
