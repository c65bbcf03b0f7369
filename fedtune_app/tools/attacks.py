"""One hostile client against each defence: the reliability table of the README.

    python -m fedtune_app.tools.attacks --run-config 'preset="smoke"' --out results/attacks

For each attack of ``apps.faults`` (huge, flip, noise, diverge) sent by client ``--attacker``
in every round, and each defence (today's mean without screening, the default screening with
the mean, each robust aggregator without screening), one in-process run (the real ServerApp
logic and ClientApp over the in-process Grid, as ``tools.compare``). Reported: the final
accuracy, the replies rejected, the rounds whose state was kept, and the distance of the final
trainable state to the honest run of the same aggregator (no attack):
||theta - theta_honest|| / ||theta_honest - theta_0|| over all trainable tensors, theta_0 the
initial state (1.0 = as far from the honest run as the honest run moved in total). Writes
``attacks.md`` and ``attacks.json`` under ``--out``; ``--defences before,default`` runs only those
columns (a long job).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from flwr.app import MessageType
from flwr.common.config import parse_config_args
from safetensors.numpy import load_file

from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
from fedtune_app.apps.evaluation import build_global
from fedtune_app.apps.server import run_federation
from fedtune_app.config import setup_logging
from fedtune_app.data.scenarios import num_clients
from fedtune_app.methods import resolve_config

ATTACKS = ("huge", "flip", "noise", "diverge")
DEFENCES = {  # name -> (column title, run-config keys)
    "before": ("mean, no screening (before)", {"aggregator": "mean", "screen-updates": False}),
    "default": ("mean + screening (default)", {"aggregator": "mean", "screen-updates": True}),
    "median": ("median, no screening", {"aggregator": "median", "screen-updates": False}),
    "trimmed-mean": ("trimmed-mean, no screening", {"aggregator": "trimmed-mean",
                                                    "screen-updates": False}),
    "clipped-mean": ("clipped-mean, no screening", {"aggregator": "clipped-mean",
                                                    "screen-updates": False}),
}


def drop_training(pid: int) -> dict:
    """The in-process grid loses every training reply of client ``pid``."""
    return {pid: lambda msg, reply: None if msg.metadata.message_type == MessageType.TRAIN
            else reply}


def one_run(run_config: dict, out: Path, faults: dict | None = None) -> dict:
    cfg = resolve_config(run_config | {"results-dir": str(out)})
    grid = InProcessGrid(None, simulation_nodes(num_clients(cfg)),
                         run_config | {"results-dir": str(out)}, faults)
    from client_app import app  # the app's own ClientApp, at the top of the project

    grid.client_app = app
    folder = Path(run_federation(grid, cfg))
    metrics = json.loads((folder / "metrics.json").read_text())
    accuracy = [m["accuracy"] for m in metrics if m["accuracy"] is not None][-1]
    return {"folder": str(folder), "accuracy": accuracy,
            "rejected": sum(len(m["rejected"]) for m in metrics),
            "kept": sum(1 for m in metrics if not m["state-updated"])}


def distance(folder: str, honest: str, initial: dict) -> float:
    a, b = load_file(f"{folder}/state.safetensors"), load_file(f"{honest}/state.safetensors")
    num = sum(np.sum((a[n].astype(np.float64) - b[n]) ** 2) for n in b)
    den = sum(np.sum((b[n].astype(np.float64) - initial[n]) ** 2) for n in b)
    return float(np.sqrt(num / den))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-config", default='preset="smoke"')
    parser.add_argument("--attacker", type=int, default=0, help="partition id of the attacker")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--defences", default=",".join(DEFENCES),
                        help=f"columns, comma separated: {', '.join(DEFENCES)}")
    parser.add_argument("--out", default="results/attacks")
    args = parser.parse_args(argv)
    defences = {DEFENCES[d][0]: DEFENCES[d][1] for d in args.defences.split(",")}
    setup_logging()
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    base = parse_config_args([args.run_config])
    out = Path(args.out)
    rows, honest = {}, {}
    for name, keys in defences.items():
        honest[name] = one_run(base | keys, out / "honest")
    cfg = resolve_config(base)
    model, recipe = build_global(cfg)
    initial = recipe.initial_state(model, cfg["seed"])  # what the server starts from
    for attack in args.attacks.split(","):
        for name, keys in defences.items():
            result = one_run(base | keys | {"fault-injection": f"{attack}={args.attacker}"},
                             out / attack)
            result["distance"] = distance(result["folder"], honest[name]["folder"], initial)
            rows.setdefault(attack, {})[name] = result
    dropped = one_run(base, out / "dropped", drop_training(args.attacker))
    dropped["distance"] = distance(dropped["folder"], honest[DEFENCES["default"][0]]["folder"]
                                   if DEFENCES["default"][0] in honest else
                                   one_run(base, out / "honest")["folder"], initial)
    lines = ["| attack | " + " | ".join(defences) + " |", "|---" * (len(defences) + 1) + "|",
             "| none (honest run) | " + " | ".join(
                 f"0 / {honest[n]['accuracy']:.3f}" for n in defences) + " |"]
    for attack, by_defence in rows.items():
        lines.append(f"| {attack} | " + " | ".join(
            f"{r['distance']:.3g} / {r['accuracy']:.3f} (rej {r['rejected']}, kept {r['kept']})"
            for r in by_defence.values()) + " |")
    lines.append(f"\nattacker's replies dropped (default keys): distance "
                 f"{dropped['distance']:.3g}, accuracy {dropped['accuracy']:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "attacks.md").write_text("\n".join(lines) + "\n")
    (out / "attacks.json").write_text(json.dumps({"honest": honest, "attacks": rows,
                                                  "dropped": dropped}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
