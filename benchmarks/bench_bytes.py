"""(c) Bytes per round per client, down (server -> client) and up (client -> server).

Builds the round's messages with the real strategy (FedRA plans for the job's capacities) and
the replies the way the client builds them, and counts:

- needed:   the planned trainable tensors, numel * 4 bytes (float32), nothing else;
- wire:     what Flower ships: the message and all its nested objects (arrays, records,
            metadata) deflated as for the SuperLink / SuperNode transport;
- frozen:   what shipping the client's whole sub-network would cost (stem, the planned blocks
            with their frozen weights, neck, head: what the official FedRA code sends).

    python benchmarks/bench_bytes.py                 # default (MiniLM) and smoke (Mixer)
"""

from __future__ import annotations

import argparse

import numpy as np  # noqa: E402
from flwr.app import Message  # noqa: E402

from common import save, table
from fedtune_app.config import app_defaults  # noqa: E402
from fedtune_app.data.splits import run_num_classes
from fedtune_app.federated.flower_private import (
    TaskIdentity,  # noqa: E402
    get_all_nested_objects,  # noqa: E402
)
from fedtune_app.federated.strategy import ClientInfo, from_record, to_record  # noqa: E402
from fedtune_app.federated.wire import TrainReply, TrainTask  # noqa: E402
from fedtune_app.methods import (
    METHODS,  # noqa: E402
    resolve_config,  # noqa: E402
)
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, initial_state  # noqa: E402
from fedtune_app.model.backbones import ModelSpec, build_backbone  # noqa: E402

JOBS = {"default": {}, "smoke": {"preset": "smoke"}}


def wire_bytes(msg: Message) -> int:
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())


def measure(job: str) -> dict:
    cfg = resolve_config({**app_defaults(), **JOBS[job]})
    model = attach_adapters(build_backbone(ModelSpec.from_config(cfg.model, run_num_classes(cfg))),
                            AdapterSpec.from_config(cfg.adapter))
    capacities = cfg.federation.capacity_list
    clients = [ClientInfo(100 + i, i, c, 100, f"client-{i}") for i, c in enumerate(capacities)]
    # random values: Flower ships content-addressed objects, so the all-zero LoRA B tensors of
    # round 1 would be sent once; after training every tensor differs
    rng = np.random.default_rng(0)
    state = {n: rng.standard_normal(v.shape).astype(np.float32)
             for n, v in initial_state(model, cfg.seed).items()}
    strategy = METHODS[cfg.method].strategy(cfg, clients, model.num_blocks, state)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    messages = strategy.configure_train(1, to_record(strategy.state), None, grid=None)
    rows = []
    for client, msg in zip(clients, messages):
        task = TrainTask.from_message(msg)
        plan, tensors = task.layers, from_record(task.arrays)
        needed = sum(4 * v.size for v in tensors.values())
        sub = model.subnetwork(plan)
        frozen = sum(4 * t.numel() for t in sub.state_dict().values())
        # the client's reply: the same tensors (trained) and its metrics, as handle_train builds it
        trained = {n: v + 1 for n, v in tensors.items()}
        reply = TrainReply(to_record(trained), 100, 1.0, {
            "fit-seconds": 1.0, "train-seconds": 1.0, "pid": 1, "peak-rss-mb": 1.0,
            "torch-threads": 1, "backbone-builds": 1}).to_message(msg)
        down, up = wire_bytes(msg), wire_bytes(reply)
        rows.append({"client": client.partition_id, "layers": len(plan), "needed B": needed,
                     "down B": down, "up B": up, "down overhead": down / needed - 1,
                     "up overhead": up / needed - 1, "with frozen B": frozen,
                     "frozen/needed": frozen / needed})
    total = {k: sum(r[k] for r in rows) for k in ("needed B", "down B", "up B", "with frozen B")}
    return {"model": cfg.model.model, "rows": rows, "total": total,
            "down-overhead": total["down B"] / total["needed B"] - 1,
            "up-overhead": total["up B"] / total["needed B"] - 1,
            "frozen-over-needed": total["with frozen B"] / total["needed B"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", default=["default", "smoke"], choices=JOBS)
    args = parser.parse_args()
    results, texts = {}, []
    for job in args.jobs:
        res = results[job] = measure(job)
        texts.append(table(
            f"Bytes per client, one FedRA round, {res['model']}: down +{res['down-overhead']:.2%}, "
            f"up +{res['up-overhead']:.2%} over the planned trainables; shipping the frozen "
            f"sub-network would be {res['frozen-over-needed']:.0f}x", res["rows"]))
    print(f"\nwrote {save('bytes', {'args': vars(args), 'jobs': results, 'table': texts})}")


if __name__ == "__main__":
    main()
