"""Helpers the benchmarks share: run `flwr run .` and time it, the plain PyTorch loop the
simulation is compared with, and the small table + JSON every benchmark writes.

Benchmarks measure speed; they are not tests. Run them on an otherwise idle machine: every
number is a ratio taken within one run, but a busy machine still skews ratios.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from torch import nn  # noqa: E402

if TYPE_CHECKING:
    from fedtune_app.config import TrainingConfig

OUT = ROOT / "benchmarks" / "results"
# where `flwr` lives: beside this Python (a venv), else on PATH (packages installed elsewhere)
BIN = Path(sys.executable).parent if (Path(sys.executable).parent / "flwr").exists() else \
    Path(shutil.which("flwr") or sys.executable).parent

# ViT-B/16-sized (random init, synthetic 224x224 images, bf16) on one GPU shared by 4 clients
GPU_JOB = {"name": "ViT-B/16 on GPU (synthetic 224x224)", "supernodes": 4, "run_config": {
    "model": "vit_base_patch16_224", "model-source": "random", "dataset": "synthetic",
    "image-size": 224, "train-subset": 4096, "test-subset": 512, "partitioner": "iid",
    "capacities": "12,10,8,6", "batch-size": 32, "device": "cuda", "precision": "bf16",
    "num-server-rounds": 5, "eval-batch-size": 128}}
GPU_JOB_8 = {**GPU_JOB, "name": "ViT-B/16 on GPU, 8 clients", "supernodes": 8,
             "run_config": {**GPU_JOB["run_config"], "capacities": "12,10,8,6,12,10,8,6"}}
# the main job's federation (Makefile FEDERATION) and the smoke preset's (6 rounds instead of 2:
# the steady state is rounds 2..6; 5 would read as "not given", being the main job's value)
DEFAULT_JOB = {"name": "default (MiniLM, BBC)", "run_config": {}, "supernodes": 6}
SMOKE_JOB = {"name": "smoke (timm Mixer, digits)",
             "run_config": {"preset": "smoke", "num-server-rounds": 6}, "supernodes": 3}


# -- flwr run ---------------------------------------------------------------------------------
def flower_env(flwr_home: Path) -> dict:
    return {**os.environ, "FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0",
            "PATH": f"{BIN}:{os.environ['PATH']}"}


def stop_processes_of(flwr_home: Path) -> None:
    """`flwr run` leaves a detached local SuperLink: stop the one under our FLWR_HOME and its
    children (the simulation and its Ray workers), nothing else."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(flwr_home) in " ".join(proc.info["cmdline"] or []):
                for p in proc.children(recursive=True) + [proc]:
                    p.kill()
        except psutil.NoSuchProcess:
            pass


def flwr_run(workdir: Path, run_config: dict, supernodes: int, cpus_per_client: float = 1,
             app: Path = ROOT, gpus_per_client: float = 0) -> dict:
    """One `flwr run` through the Ray simulation; returns the results folder, the wall time
    and the launch time (epoch seconds, to compare with the rounds' start times)."""
    home = workdir / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    keys = {**run_config, "results-dir": str(workdir / "results")}
    cmd = [str(BIN / "flwr"), "run", str(app), "--stream", "--federation-config",
           f"num-supernodes={supernodes} client-resources-num-cpus={cpus_per_client:g} "
           f"client-resources-num-gpus={gpus_per_client:g}",
           "--run-config", " ".join(f"{k}={json.dumps(v)}" for k, v in keys.items())]
    launched = time.time()
    try:
        proc = subprocess.run(cmd, env=flower_env(home), capture_output=True, text=True,
                              timeout=1800)
    finally:
        stop_processes_of(home)
    wall = time.time() - launched
    log = proc.stdout + proc.stderr
    (workdir / "flwr-run.log").write_text(log)
    match = re.search(r"RESULTS (\S+)", log)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"flwr run failed (log: {workdir / 'flwr-run.log'}):\n{log[-3000:]}")
    return {"folder": Path(match.group(1)), "wall": wall, "launched": launched}


# -- the plain PyTorch loop -------------------------------------------------------------------
def plain_train(model, plan, inputs, labels, training: TrainingConfig, seed: int,
                device=torch.device("cpu")) -> None:
    """What a client's round costs without any framework: the same sub-network, optimiser,
    batches, precision and clipping, in a bare loop on tensors already in (host) memory."""
    from fedtune_app.training.local import autocast, to_device

    sub = model.subnetwork(plan)
    params = [p for p in sub.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=training.lr, momentum=training.momentum,
                                weight_decay=training.weight_decay)
    sub.train()
    n = len(labels)
    for _ in range(training.local_epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        for start in range(0, n, training.batch_size):
            idx = order[start:start + training.batch_size]
            x = {k: v[idx] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[idx]
            with autocast(training.precision, device):
                logits = sub(to_device(x, device))
            loss = nn.functional.cross_entropy(logits.float(), labels[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if training.grad_clip > 0:
                nn.utils.clip_grad_norm_(params, training.grad_clip)
            optimizer.step()
    sub.eval()


@torch.inference_mode()
def plain_eval(model, plan, inputs, labels, batch_size: int, device=torch.device("cpu"),
               precision: str = "fp32") -> None:
    from fedtune_app.training.local import autocast, to_device

    model.eval()
    for start in range(0, len(labels), batch_size):
        sl = slice(start, start + batch_size)
        x = {k: v[sl] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[sl]
        with autocast(precision, device):
            logits = model(to_device(x, device), plan)
        nn.functional.cross_entropy(logits.float(), labels[sl].to(device)).item()


# -- output -----------------------------------------------------------------------------------
def save(name: str, payload: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    payload = {"benchmark": name, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
               "cpus": os.cpu_count(), "torch-threads": torch.get_num_threads(),
               "load-average": os.getloadavg(), **payload}
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def table(title: str, rows: list[dict]) -> str:
    """A Markdown table of ``rows`` (same keys), printed and returned."""
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    cols = list(rows[0])
    lines = [f"\n{title}", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text
