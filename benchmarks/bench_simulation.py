"""(a) simulation efficiency, (d) memory, (e) end-to-end time, and the bytes a real run sent.

Runs `flwr run .` (Ray simulation) for a job, then trains the SAME sub-networks (the plans in
the run's allocation.json) on the SAME client data back to back in this process with a plain
PyTorch loop, and divides: steady-state round time / plain-loop round time.

    python benchmarks/bench_simulation.py                 # default job + smoke job
    python benchmarks/bench_simulation.py --jobs smoke --rounds 4
    python benchmarks/bench_simulation.py --inprocess     # no Ray: checks the script itself
    python benchmarks/bench_simulation.py --jobs vit-b-gpu --gpus-per-client 0.25  # 4 on 1 GPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch  # noqa: E402

from common import (
    DEFAULT_JOB,
    GPU_JOB,
    GPU_JOB_8,
    ROOT,
    SMOKE_JOB,
    flwr_run,
    plain_eval,
    plain_train,
    save,
    table,
)
from fedtune_app.data.splits import client_examples, run_num_classes, run_splits
from fedtune_app.federated.strategy import ClientInfo  # noqa: E402
from fedtune_app.methods import METHODS, resolve_config  # noqa: E402
from fedtune_app.model.adapters import AdapterSpec, attach_adapters  # noqa: E402
from fedtune_app.model.backbones import ModelSpec, build_backbone  # noqa: E402
from fedtune_app.training.local import pick_device  # noqa: E402


def sync(device) -> None:
    if device.type == "cuda":  # CUDA runs asynchronously: time finished work only
        torch.cuda.synchronize()

JOBS = {"default": DEFAULT_JOB, "smoke": SMOKE_JOB, "vit-b-gpu": GPU_JOB, "vit-b-gpu-8": GPU_JOB_8}


def run_inprocess(workdir: Path, run_config: dict, supernodes: int) -> dict:
    """The same federation through the in-process Grid (no Ray, no SuperLink)."""
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
    from fedtune_app.apps.server import run_federation
    from fedtune_app.config import app_defaults
    from fedtune_app.methods import resolve_config

    rc = {**app_defaults(), **run_config, "results-dir": str(workdir / "results")}
    launched = time.time()
    folder = run_federation(InProcessGrid(client_app, simulation_nodes(supernodes), rc),
                            resolve_config(rc))
    return {"folder": Path(folder), "wall": time.time() - launched, "launched": launched}


def plain_loop(folder: Path, steady: list[int]) -> dict:
    """Seconds per round of the plain loop over the run's own plans and client data."""
    config = json.loads((folder / "config.json").read_text())
    cfg = resolve_config(config["run-config"])
    clients = [ClientInfo(**c) for c in config["clients"]]
    allocation = {r["round"]: r for r in json.loads((folder / "allocation.json").read_text())}
    device = pick_device(cfg.training.device)
    model = attach_adapters(build_backbone(ModelSpec.from_config(cfg.model, run_num_classes(cfg))),
                            AdapterSpec.from_config(cfg.adapter)).to(device)
    splits = run_splits(cfg)
    data = {c.partition_id: client_examples(cfg, splits, c.partition_id, len(clients))
            for c in clients}
    eval_plan = METHODS[cfg.method].strategy(cfg, clients, model.num_blocks, {}).eval_plan()

    def one_round(r: int) -> None:
        row = allocation[r]
        for pid, mask in zip(row["clients"], row["matrix"]):
            plan = tuple(j for j, held in enumerate(mask) if held)
            plain_train(model, plan, data[pid].inputs, data[pid].labels, cfg.training,
                        seed=r * 31 + pid, device=device)
        sync(device)

    one_round(1)  # warm-up, as the simulation's first round is
    train, evaluate = [], []
    for r in steady:
        started = time.perf_counter()
        one_round(r)
        train.append(time.perf_counter() - started)
        started = time.perf_counter()
        plain_eval(model, eval_plan, splits.test.inputs, splits.test.labels,
                   cfg.federation.eval_batch_size, device, cfg.training.precision)
        evaluate.append(time.perf_counter() - started)
    return {"train": sum(train) / len(train), "eval": sum(evaluate) / len(evaluate),
            "per-round-train": train}


def analyse(run: dict) -> dict:
    folder = run["folder"]
    metrics = json.loads((folder / "metrics.json").read_text())
    steady = [m for m in metrics if m["round"] > 1]
    if not steady:
        raise SystemExit("need at least 2 rounds for a steady state (--rounds)")
    round_s = sum(m["seconds"] for m in steady) / len(steady)
    eval_s = sum(m["eval-seconds"] or 0.0 for m in steady) / len(steady)
    plain = plain_loop(folder, [m["round"] for m in steady])
    plain_eval_s = plain["eval"] * sum(m["eval-seconds"] is not None for m in steady) / len(steady)
    out = {
        "folder": str(folder), "rounds": len(metrics), "wall-seconds": run["wall"],
        "startup-seconds": (metrics[0]["started"] - run["launched"]) if "started" in metrics[0]
        else None,  # runs of older checkouts do not record it
        "first-round-seconds": metrics[0]["seconds"],
        "steady-round-seconds": round_s, "steady-eval-seconds": eval_s,
        "plain-train-seconds": plain["train"], "plain-eval-seconds": plain["eval"],
        "ratio-train": (round_s - eval_s) / plain["train"],
        "ratio-round": round_s / (plain["train"] + plain_eval_s),
    }
    # bytes the run reports (ArrayRecord bytes) vs the planned trainables (numel * 4)
    needed = sum(4 * sum(m["trainable-params"].values()) for m in metrics)
    out["bytes-down-over-needed"] = sum(m["bytes-down"] for m in metrics) / needed
    out["bytes-up-over-needed"] = sum(m["bytes-up"] for m in metrics) / needed
    # memory and backbone builds per client process, from the reply metrics
    procs: dict[int, dict] = {}
    for m in metrics:
        for pid, cm in (m.get("client-metrics") or {}).items():
            p = procs.setdefault(int(cm["pid"]), {"messages": 0, "clients": set()})
            p["messages"] += 1
            p["clients"].add(int(pid))
            p["peak-rss-mb"] = max(p.get("peak-rss-mb", 0), cm["peak-rss-mb"])
            p["backbone-builds"] = max(p.get("backbone-builds", 0), cm["backbone-builds"])
            p["torch-threads"] = cm["torch-threads"]
            p["gpu-peak-mb"] = max(p.get("gpu-peak-mb", 0), cm.get("gpu-peak-mb", 0))
            p["fit-seconds"] = p.get("fit-seconds", 0) + cm["fit-seconds"]
            p["train-seconds"] = p.get("train-seconds", 0) + cm["train-seconds"]
    out["client-processes"] = {pid: {**p, "clients": sorted(p["clients"])}
                               for pid, p in procs.items()}
    if procs:
        out["handler-overhead"] = (sum(p["train-seconds"] for p in procs.values())
                                   / sum(p["fit-seconds"] for p in procs.values()) - 1)
    out["server"] = metrics[-1].get("server")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", default=["default", "smoke"], choices=JOBS)
    parser.add_argument("--rounds", type=int, default=0, help="override num-server-rounds")
    parser.add_argument("--eval-every", type=int, default=0, help="override eval-every")
    parser.add_argument("--cpus-per-client", type=float, default=1)
    parser.add_argument("--gpus-per-client", type=float, default=0, help="e.g. 0.25: four "
                        "clients share one GPU at a time (Ray resources)")
    parser.add_argument("--app", default=str(ROOT), help="app directory to run (e.g. an older "
                        "checkout, for before/after numbers)")
    parser.add_argument("--inprocess", action="store_true", help="no Ray (checks the script)")
    parser.add_argument("--plain-threads", type=int, default=0, help="torch threads of the plain "
                        "loop (0 = torch's default; 1 is robust on a machine others also load)")
    parser.add_argument("--tag", default="", help="suffix of the results JSON file")
    args = parser.parse_args()
    if args.plain_threads:
        torch.set_num_threads(args.plain_threads)
    results, rows = {}, []
    for key in args.jobs:
        job = JOBS[key]
        run_config = dict(job["run_config"])
        if args.rounds:
            run_config["num-server-rounds"] = args.rounds
        if args.eval_every:
            run_config["eval-every"] = args.eval_every
        with tempfile.TemporaryDirectory(prefix="fedtune-bench-") as tmp:
            if args.inprocess:
                run = run_inprocess(Path(tmp), run_config, job["supernodes"])
            else:
                run = flwr_run(Path(tmp), run_config, job["supernodes"], args.cpus_per_client,
                               app=Path(args.app), gpus_per_client=args.gpus_per_client)
            res = analyse(run)
        results[key] = res
        procs = res["client-processes"].values()
        rows.append({
            "job": job["name"], "wall s": res["wall-seconds"], "start-up s": res["startup-seconds"],
            "round 1 s": res["first-round-seconds"], "steady round s": res["steady-round-seconds"],
            "of it eval s": res["steady-eval-seconds"], "plain train s": res["plain-train-seconds"],
            "plain eval s": res["plain-eval-seconds"],
            "ratio train": res["ratio-train"], "ratio round": res["ratio-round"],
            "client procs": len(procs),
            "builds/proc": max((p["backbone-builds"] for p in procs), default="-"),
            "client peak MB": max((p["peak-rss-mb"] for p in procs), default="-"),
            "client GPU peak MB": max((p.get("gpu-peak-mb", 0) for p in procs), default="-"),
            "server peak MB": (res["server"] or {}).get("peak-rss-mb", "-"),
            "torch threads": sorted({p["torch-threads"] for p in procs}) or "-",
            "bytes down/needed": res["bytes-down-over-needed"],
        })
    mode = "in-process (no Ray)" if args.inprocess else \
        f"flwr run, {args.cpus_per_client:g} CPU" + \
        (f" and {args.gpus_per_client:g} GPU" if args.gpus_per_client else "") + " per client"
    text = table(f"Simulation efficiency ({mode}): steady round / plain PyTorch loop", rows)
    path = save("simulation" + (f"-{args.tag}" if args.tag else ""),
                {"mode": mode, "args": vars(args), "jobs": results, "table": text})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
