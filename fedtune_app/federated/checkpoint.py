"""Checkpoint and resume: a stopped run continues to exactly the state it would have reached.

``checkpoint.safetensors`` in the results folder holds, in ONE file written then renamed (a
crash leaves the previous checkpoint whole, never half a file):

    tensors   state/<name>   the global trainable state
              extra/<name>   a method's other server tensors (``LayerPlanStrategy.extra_state``)
              rng/torch      torch's global RNG state of the server process
    metadata  fedtune-checkpoint: JSON with the round, the strategy's numpy RNG states
              (the method's allocation, client sampling, dynamic capacities), the round
              history (plans, bytes, rejections), the per-round metrics so far, the resolved
              config and the clients.

Everything else a round depends on is derived from the seed (partitions, the clients' local
training seed = f(seed, round, partition)), so restoring this is enough for a bit-identical
continuation. Safetensors, not pickle: loading a checkpoint never runs code.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from fedtune_app.config import ConfigError, RunConfig
from fedtune_app.federated.strategy import ClientInfo, LayerPlanStrategy, RoundLog

FILE = "checkpoint.safetensors"
META = "fedtune-checkpoint"
# keys that may change between the stopped run and its resumption: none changes the state
# ('preset-overrides' only names the keys a user gave: the values they resolve to are compared)
MAY_CHANGE = ("num-server-rounds", "resume", "results-dir", "checkpoint-every", "round-timeout",
              "eval-every", "eval-batch-size", "device", "min-nodes", "preset", "preset-overrides")


def _client_facts(clients: list[ClientInfo]) -> list[dict]:
    """What identifies the clients across restarts (node ids are random per connection; a
    one-time weights fetch happens only in the first)."""
    return [{k: v for k, v in asdict(c).items()
             if k not in ("node_id", "checkpoint_bytes", "num_partitions")}
            | {"label_counts": list(c.label_counts)} for c in clients]


def _round_to_json(entry: RoundLog) -> dict:
    return asdict(entry) | {"plans": {str(p): list(plan) for p, plan in entry.plans.items()},
                            "rejected": {str(p): why for p, why in entry.rejected.items()}}


def _round_from_json(record: dict) -> RoundLog:
    return RoundLog(**record | {"plans": {int(p): tuple(v) for p, v in record["plans"].items()},
                                "rejected": {int(p): v for p, v in record["rejected"].items()}}
                    | {k: {int(p): v for p, v in record[k].items()}
                       for k in ("nodes", "errors") if k in record})


def save_checkpoint(folder: Path, strategy: LayerPlanStrategy, metrics: list[dict],
                    cfg: RunConfig) -> Path:
    from safetensors.numpy import save_file

    tensors = {f"state/{k}": np.ascontiguousarray(v) for k, v in strategy.state.items()}
    tensors |= {f"extra/{k}": np.ascontiguousarray(v) for k, v in strategy.extra_state().items()}
    tensors["rng/torch"] = torch.get_rng_state().numpy()
    meta = {"round": strategy.history[-1].round, "config": dict(cfg.flat),
            "clients": _client_facts(strategy.clients),
            "rng": strategy.rng.bit_generator.state,
            "rng-sampling": strategy.sampling_rng.bit_generator.state,
            "rng-capacity": strategy.capacity_rng.bit_generator.state,
            "history": [_round_to_json(e) for e in strategy.history], "metrics": metrics}
    path = Path(folder) / FILE
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={META: json.dumps(meta, default=float)})
    os.replace(tmp, path)
    return path


def _read(resume: str) -> tuple[dict[str, np.ndarray], dict]:
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    path = Path(resume)
    if path.is_dir():
        path = path / FILE
    if not path.is_file():
        raise ConfigError(f"run-config key 'resume' = {resume!r}: no checkpoint file {path}; "
                          f"give a results folder holding {FILE} (written every "
                          "'checkpoint-every' rounds)")
    try:
        with safe_open(str(path), "np") as f:
            meta = json.loads((f.metadata() or {})[META])
        tensors = load_file(str(path))
    except (SafetensorError, KeyError, ValueError, OSError) as err:
        raise ConfigError(f"run-config key 'resume' = {resume!r}: {path} is not a readable "
                          f"fedtune checkpoint ({err.__class__.__name__}: {err}); it may be "
                          "truncated or from another program") from None
    return tensors, meta


def resume(strategy: LayerPlanStrategy, cfg: RunConfig) -> list[dict]:
    """Restore ``strategy`` from the checkpoint named by key 'resume' after checking that this
    run is the same run; returns the metrics records of the rounds already done."""
    tensors, meta = _read(cfg.federation.resume)
    given = cfg.flat
    changed = [f"'{k}' = {v!r} (checkpoint: {meta['config'].get(k)!r})" for k, v in given.items()
               if k not in MAY_CHANGE and v != meta["config"].get(k)]
    if changed:
        raise ConfigError("run-config key 'resume': the stopped run had other settings; "
                          "resuming needs the same values for " + ", ".join(changed))
    if _client_facts(strategy.clients) != meta["clients"]:
        raise ConfigError("run-config key 'resume': the connected clients differ from the "
                          f"stopped run's: {_client_facts(strategy.clients)} vs {meta['clients']}")
    done = int(meta["round"])
    if done >= cfg.federation.num_server_rounds:
        raise ConfigError(f"run-config key 'resume': the checkpoint already has {done} rounds; "
                          f"key 'num-server-rounds' = {cfg.federation.num_server_rounds} adds none")
    state = {k.removeprefix("state/"): v for k, v in tensors.items() if k.startswith("state/")}
    expected = {k: v.shape for k, v in strategy.state.items()}
    if {k: v.shape for k, v in state.items()} != expected:
        raise ConfigError("run-config key 'resume': the checkpoint's trainable tensors do not "
                          "match this model and adapter (names or shapes differ)")
    strategy.state = state
    strategy.load_extra_state({k.removeprefix("extra/"): v for k, v in tensors.items()
                               if k.startswith("extra/")})
    strategy.rng.bit_generator.state = meta["rng"]
    strategy.sampling_rng.bit_generator.state = meta["rng-sampling"]
    strategy.capacity_rng.bit_generator.state = meta["rng-capacity"]
    torch.set_rng_state(torch.from_numpy(tensors["rng/torch"]))
    strategy.history = [_round_from_json(r) for r in meta["history"]]
    strategy.round_offset = done
    return meta["metrics"]
