"""The results folder of a run (DESIGN.md section 6).

    config.json        resolved run config, the data set's class names and what each node
                       reported (rewritten at the end)
    metrics.json       one record per round (rewritten after every round, atomically)
    allocation.json    the allocation matrix of every round
    state.safetensors  final global trainable state (wire names)
    accuracy.png       global test accuracy per round
    partition.png      label counts and capacities (per round) of every client
    tensorboard/       with run-config key tracker = "tensorboard" (see apps/tracking.py)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from fedtune_app.apps.plots import plot_partition
from fedtune_app.apps.tracking import make_tracker, round_scalars
from fedtune_app.config import RunConfig
from fedtune_app.data.splits import class_names_of
from fedtune_app.federated.wire import TRAINED_BATCHED
from fedtune_app.model.perf import process_stats
from fedtune_app.model.progress import clock

log = logging.getLogger("fedtune")
# called with (run config, round record) after every round of a run in this process: progress
# bars of the tools that run many federations (compare, notebooks)
ROUND_LISTENERS: list = []


@contextlib.contextmanager
def round_listener(callback):
    ROUND_LISTENERS.append(callback)
    try:
        yield callback
    finally:
        ROUND_LISTENERS.remove(callback)


def write_json(path: Path, value) -> None:
    """Write then rename, so a reader (or a crash) never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, default=float))
    os.replace(tmp, path)


def results_root(cfg: RunConfig) -> Path:
    folder = cfg.federation.results_dir or os.environ.get("FEDTUNE_RESULTS_DIR") or "results"
    return Path(folder).resolve()


def trained_by_engine(client_metrics) -> dict[str, int]:
    """How many of the accepted replies each client engine trained (their ``trained-batched``
    metric; a reply without it, from a node of older code, trained sequentially)."""
    batched = sum(1 for m in client_metrics if m.get(TRAINED_BATCHED))
    return {"sequential": len(client_metrics) - batched, "batched": batched}


class ResultsWriter:
    def __init__(self, cfg: RunConfig, strategy, clients, metrics: list[dict] = ()):
        self.cfg, self.strategy = cfg, strategy
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = results_root(cfg) / f"{cfg.method}-seed{cfg.seed}-{stamp}"
        folder, n = base, 1
        while folder.exists():
            folder, n = Path(f"{base}-{n}"), n + 1
        folder.mkdir(parents=True)
        self.folder = folder
        self.started, self.rounds_done = time.time(), 0  # this process's rounds: elapsed, ETA
        self.metrics: list[dict] = list(metrics)  # a resumed run starts with the earlier rounds
        self.class_names = class_names_of(cfg.data)
        self.write_config(clients)
        self.tracker = make_tracker(cfg, folder)
        for record in self.metrics:  # a resumed run's tracker gets the earlier rounds too
            self._track(record)

    def write_config(self, clients) -> None:
        """The run config and the clients (at start; at the end: every partition that took
        part, with the node that served it last)."""
        write_json(self.folder / "config.json", {"run-config": dict(self.cfg.flat),
                                                 "class-names": self.class_names,
                                                 "clients": [asdict(c) for c in clients]})

    def record_round(self, server_round: int, evaluation: dict | None) -> None:
        entry = self.strategy.history[-1]
        assert entry.round == server_round
        evaluation = evaluation or {}
        trainable = {pid: sum(self.strategy.trained_size(pid, n) for n in names)
                     for pid, names in self.strategy.payload_names(entry).items()}
        record = {
            "round": server_round,
            "accuracy": evaluation.get("accuracy"),  # headline: mean over domains if any
            "accuracy-pooled": evaluation.get("accuracy-pooled"),  # over all test examples
            "accuracy-per-group": evaluation.get("accuracy-per-group"),
            "accuracy-per-class": evaluation.get("accuracy-per-class"),
            "loss": evaluation.get("loss"),
            "train-loss": entry.train_loss,
            "bytes-down": entry.bytes_down,
            "bytes-up": entry.bytes_up,
            "trainable-params": trainable,
            "clients": sorted(entry.plans),
            "nodes": {str(p): n for p, n in sorted(entry.nodes.items())},  # who served which
            "offline": entry.offline,  # partitions whose node was not online: not sent work
            "rejected": entry.rejected,
            "errors": entry.errors,  # Flower's error code and reason of error replies
            "ignored": entry.ignored,
            "membership": entry.membership,  # nodes that joined, took a partition over, failed
            "state-updated": entry.state_updated,
            "eval-seconds": evaluation.get("eval-seconds"),
            "started": entry.started,
            "seconds": time.time() - entry.started,
            "client-metrics": entry.client_metrics,  # train/fit seconds, pid, peak RSS per client
            "client-engines": trained_by_engine(list(entry.client_metrics.values())),
            "server": process_stats(),
        }
        record |= {k: v for k, v in evaluation.items() if k not in record}  # method's extras
        record |= {k: v for k, v in entry.method_metrics.items() if k not in record}
        self.metrics.append(record)
        write_json(self.folder / "metrics.json", self.metrics)
        self._track(record)
        for callback in ROUND_LISTENERS:
            callback(self.cfg, record)
        self.rounds_done += 1
        elapsed = time.time() - self.started
        eta = elapsed / self.rounds_done * (self.cfg.federation.num_server_rounds - server_round)
        acc = "   -  " if record["accuracy"] is None else f"{record['accuracy']:.4f}"
        pooled = record["accuracy-pooled"]
        if pooled is not None and f"{pooled:.4f}" != acc:  # unequal domains: show both
            acc += f" (pooled {pooled:.4f})"
        loss = "  -  " if record["loss"] is None else f"{record['loss']:.3f}"
        log.info("round %d/%d | accuracy %s | loss %s | train-loss %.3f | down %.2f MB | "
                 "up %.2f MB | rejected %d | %.1f s | elapsed %s | ETA %s", server_round,
                 self.cfg.federation.num_server_rounds, acc, loss, entry.train_loss,
                 entry.bytes_down / 1e6, entry.bytes_up / 1e6, len(entry.rejected),
                 record["seconds"], clock(elapsed), clock(eta))

    def _track(self, record: dict) -> None:
        if self.tracker is not None:
            self.tracker.log_round(record["round"], round_scalars(record))

    def finish(self) -> None:
        from safetensors.numpy import save_file

        self.write_config(self.strategy.clients)
        write_json(self.folder / "allocation.json", self.strategy.allocation_matrices())
        save_file({k: np.ascontiguousarray(v) for k, v in self.strategy.export_state().items()},
                  str(self.folder / "state.safetensors"))
        plot_accuracy(self.metrics, self.folder / "accuracy.png", self.cfg.method)
        plot_partition(self.strategy.clients, self.strategy.history,
                       self.folder / "partition.png", self.class_names)
        if self.tracker is not None:
            self.tracker.close()
        log.info("fedtune: results in %s", self.folder)


def plot_accuracy(metrics: list[dict], path: Path, label: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(m["round"], m["accuracy"], m.get("accuracy-pooled")) for m in metrics
              if m["accuracy"] is not None]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    if points:
        rounds, headline, pooled = zip(*points)
        distinct = any(p is not None and abs(p - h) > 1e-6 for h, p in zip(headline, pooled))
        ax.plot(rounds, headline, marker="o",
                label=f"{label} (mean over domains)" if distinct else label)
        if distinct:
            ax.plot(rounds, pooled, marker=".", linestyle="--",
                    label=f"{label} (all test examples)")
        ax.legend()
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("global test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
