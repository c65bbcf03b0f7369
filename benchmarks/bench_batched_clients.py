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
(client training and the replies; the server's work is the same either way and not timed).
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

from common import ROOT, save
from fedtune_app.apps import client
from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
from fedtune_app.apps.server import run_federation
from fedtune_app.config import load_preset
from fedtune_app.federated.records import from_record
from fedtune_app.methods import resolve_config

MINI_FEDRA_T1 = {"preset": "mini", "method": "fedra", "capacities": "12,10,8,6,4,3",
                 "eval-every": 1000}


def setting(rounds: int, results: str) -> tuple[dict, str]:
    """The run config, and where its backbone comes from."""
    rc = MINI_FEDRA_T1 | {"num-server-rounds": rounds, "results-dir": results}
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


def sequential(rc, items) -> tuple[float, list]:
    pairs = contexts(rc, items)
    started = time.perf_counter()
    replies = [client.handle_train(m, c) for m, c in pairs]
    return time.perf_counter() - started, replies


def batched(rc, items) -> tuple[float, list]:
    pairs = contexts(rc, items)
    started = time.perf_counter()
    replies = client.handle_train_cohort(pairs)
    seconds = time.perf_counter() - started
    if sorted(replies) != list(range(len(pairs))):
        raise SystemExit(f"the batched engine left {len(pairs) - len(replies)} clients to the "
                         "sequential one: nothing to compare")
    return seconds, [replies[k] for k in range(len(pairs))]


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rc, source = setting(args.rounds, tmp)
        print(f"mini FedRA Table 1 setting, backbone: {source}; torch threads {args.threads}; "
              f"load average {os.getloadavg()[0]:.2f}")
        rounds = recorded_rounds(rc)
    sequential(rc, rounds[0])  # warm-up: both ways build the same cached model and data
    batched(rc, rounds[0])
    total_seq = total_bat = 0.0
    worst, rows = 0.0, []
    for r, items in enumerate(rounds, 1):
        seq_times, bat_times = [], []
        for k in range(args.repeats):
            order = (sequential, batched) if k % 2 == 0 else (batched, sequential)
            for way in order:
                seconds, replies = way(rc, items)
                (seq_times if way is sequential else bat_times).append(seconds)
                if way is sequential:
                    seq_replies = replies
                else:
                    bat_replies = replies
        worst = max(worst, difference(items, bat_replies, seq_replies))
        s, b = min(seq_times), min(bat_times)
        total_seq, total_bat = total_seq + s, total_bat + b
        rows.append({"round": r, "clients": len(items), "sequential-s": s, "batched-s": b})
        print(f"round {r}: {len(items)} clients, sequential {s:.3f} s, batched {b:.3f} s, "
              f"ratio {b / s:.3f}")
    ratio = total_bat / total_seq
    save("batched-clients", {"setting": MINI_FEDRA_T1, "backbone": source,
                             "threads": args.threads, "rounds": rows, "ratio": ratio,
                             "max-relative-update-difference": worst,
                             "load-average": os.getloadavg()[0], "root": str(ROOT)})
    print(f"round batched / sequential: {ratio:.3f}; max relative update difference: {worst:.2e}")


if __name__ == "__main__":
    main()
