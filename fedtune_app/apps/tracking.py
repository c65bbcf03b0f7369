"""Optional experiment tracking (run-config key ``tracker``), fed by ``ResultsWriter``: the one
place that writes ``metrics.json`` also sends each round's scalars to the tracker.

    tracker = "tensorboard"  event files in <results folder>/tensorboard
                             (``tensorboard --logdir results``)
    tracker = "mlflow"       MLflow run in the experiment "fedtune"; store: $MLFLOW_TRACKING_URI,
                             else a local SQLite file <results-dir>/mlflow.db
                             (``mlflow ui --backend-store-uri sqlite:///results/mlflow.db``)
    tracker = "wandb"        Weights & Biases, offline unless $WANDB_MODE says otherwise
                             (files in <results folder>/wandb, complete when the run returns;
                             ``wandb sync <results folder>/wandb/offline-run-*`` uploads them)

Scalars per round: accuracy, loss, train-loss, bytes-down/up, seconds, eval-seconds, rejected
clients, every ``accuracy-<output>`` of the method, and ``accuracy-per-group/<group>``,
``accuracy-per-model-group/<g>``; the config goes in once (TensorBoard: as text).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fedtune_app.config import ConfigError, RunConfig

TRACKERS = ("", "tensorboard", "mlflow", "wandb")
_PER_GROUP = ("accuracy-per-group", "accuracy-per-model-group")


def round_scalars(record: dict) -> dict[str, float]:
    """The numbers of one metrics.json record that make a curve."""
    out = {}
    for key, value in record.items():
        if key in _PER_GROUP and isinstance(value, dict):
            out |= {f"{key}/{g}": float(v) for g, v in value.items() if v is not None}
        elif key in ("rejected",):
            out["rejected-clients"] = float(len(value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and \
                key not in ("round", "started"):
            out[key] = float(value)
    return out


class Tracker:
    def log_round(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    def __init__(self, cfg: RunConfig, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(dict(cfg.flat), indent=1) + "\n```")

    def log_round(self, step, scalars):
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a crashed run keeps its curves

    def close(self):
        self.writer.close()


class MlflowTracker(Tracker):
    def __init__(self, cfg: RunConfig, folder: Path):
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{folder.parent / 'mlflow.db'}"
        self.client = mlflow.MlflowClient(uri)
        experiment = self.client.get_experiment_by_name("fedtune")
        experiment_id = experiment.experiment_id if experiment else \
            self.client.create_experiment("fedtune")
        self.run_id = self.client.create_run(experiment_id, run_name=folder.name).info.run_id
        params = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in sorted(cfg.flat.items())]
        self.client.log_batch(self.run_id, params=params)
        self.client.set_tag(self.run_id, "results-folder", str(folder))

    def log_round(self, step, scalars):
        import mlflow

        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            mlflow.entities.Metric(k, v, stamp, step) for k, v in scalars.items()])

    def close(self):
        self.client.set_terminated(self.run_id)


class WandbTracker(Tracker):
    def __init__(self, cfg: RunConfig, folder: Path):
        import wandb

        self.run = wandb.init(project="fedtune", name=folder.name, config=dict(cfg.flat),
                              dir=str(folder), mode=os.environ.get("WANDB_MODE", "offline"))

    def log_round(self, step, scalars):
        self.run.log(scalars, step=step)

    def close(self):
        import wandb

        self.run.finish()
        # finish() returns before W&B's service has written the whole run file; its teardown
        # waits for it, so the results folder is complete (and `wandb sync`-able) on return
        wandb.teardown()


def make_tracker(cfg: RunConfig, folder: Path) -> Tracker | None:
    kind = cfg.federation.tracker
    if not kind:
        return None
    builders = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker,
                "wandb": WandbTracker}
    try:
        return builders[kind](cfg, folder)
    except ImportError as err:
        raise ConfigError(f"run-config key 'tracker' = {kind!r} needs the package "
                           f"{err.name!r} (pip install {kind})") from None
