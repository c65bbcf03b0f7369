"""Hostile clients against each defence: the tables of docs/reliability.md.

    python -m fedtune_app.tools.attacks --run-config 'preset="smoke"' --out results/attacks
    python -m fedtune_app.tools.attacks --attacks alie,min-max,flip-in-bound --attackers 0,1 \\
        --defences default,fltrust --out results/adaptive

Crude attacks (``apps.faults``: huge, flip, noise, diverge) are sent by the real ClientApp.
Adaptive attacks know the defence in force and every honest update of the round (full
knowledge: the strongest attacker of Baruch et al. 2019 and Shejwalkar and Houmansadr 2021).
Each attacker trains honestly, then replaces its update Delta, per tensor t it holds, with:

  alie           "a little is enough" (Baruch et al., NeurIPS 2019): mu_t - z sigma_t,
                 coordinate-wise mean and std of the honest holders' updates (``--z``, 1.5)
  ipm            inner-product manipulation (Xie et al., UAI 2020): -epsilon mu_t (``--epsilon``)
  min-max        (Shejwalkar and Houmansadr, NDSS 2021) mu_t + gamma p, p = -mu_t / ||mu_t||,
                 gamma the largest with max_i ||Delta - Delta_i|| <= max_ij ||Delta_i - Delta_j||
  min-sum        the same with sum_i ||Delta - Delta_i||^2 <= max_i sum_j ||Delta_i - Delta_j||^2
  flip-in-bound  -s Delta_t, its own update sign-flipped and scaled as far as screening allows
  fewest         only on the tensors with the fewest holders this round (one or two: the growth
                 bound's tensors): -mu_t scaled to the bound; elsewhere honest
  lie            declares and reports 10 x its examples (the mean weights by them) and sends
                 flip-in-bound

A tensor the attacker holds alone has no honest update to read: mu_t is its own update. Then,
knowing screening's bounds (the bound of its own local training's reach on the head's bias
included, for the example count it reports), every attack shrinks the tensors screening would
reject (x 0.8 until it passes: ``inside_screening``), so that it is never rejected. Colluders
(``--attackers 0,1``) send the same update, crafted from the honest clients' updates only.

Per (attack, defence), one in-process run (the real ServerApp logic and ClientApp over the
in-process Grid, as ``tools.compare``); per defence, an honest run and the run with the
attackers' replies dropped. Reported: final accuracy, replies rejected, and the distance of the
final trainable state to the dropped run of the same defence, ||theta - theta_dropped|| /
||theta_dropped - theta_0|| (1.0 = as far from it as it moved in total). Writes ``attacks.md``
and ``attacks.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from flwr.app import Message, MessageType
from safetensors.numpy import load_file

from fedtune_app.apps.evaluation import build_global, global_recipe
from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
from fedtune_app.apps.server import run_federation
from fedtune_app.config import RobustConfig, RunConfig, setup_logging
from fedtune_app.data.scenarios import num_clients
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.flower_private import parse_config_args
from fedtune_app.federated.records import from_record, to_record
from fedtune_app.federated.robust import norm, rms, screen, screen_verdict
from fedtune_app.federated.wire import ARRAYS, NodeAnswer, TrainReply, TrainTask
from fedtune_app.methods import resolve_config

CRUDE = ("huge", "flip", "noise", "diverge")
ADAPTIVE = ("alie", "ipm", "min-max", "min-sum", "flip-in-bound", "fewest", "lie")
DEFENCES = {  # name -> (column title, run-config keys)
    "before": ("mean, no screening", {"aggregator": "mean", "screen-updates": False}),
    "default": ("screening + mean", {"aggregator": "mean"}),
    "median": ("screening + median", {"aggregator": "median"}),
    "trimmed-mean": ("screening + trimmed-mean", {"aggregator": "trimmed-mean",
                                                  "trim-beta": 0.34}),
    "clipped-mean": ("screening + clipped-mean", {"aggregator": "clipped-mean"}),
    "fltrust": ("screening + fltrust", {"aggregator": "fltrust"}),
    "fltrust-clip": ("screening + fltrust, clipped to the holders' median",
                     {"aggregator": "fltrust", "fltrust-scale": "clip-median"}),
    "centred-clip": ("screening + centred-clip", {"aggregator": "centred-clip"}),
    "multi-krum": ("screening + multi-krum", {"aggregator": "multi-krum"}),
    "centred-clip-k3": ("screening + centred-clip, 3 holders", {"aggregator": "centred-clip",
                                                               "min-holders": 3}),
    "median-k3": ("screening + median, 3 holders", {"aggregator": "median", "min-holders": 3}),
    # Bulyan needs 4f + 3 = 7 holders of a tensor (f = 1): 7 clients or more, each block held
    # by 7 of them every round
    "bulyan-k7": ("screening + bulyan, 7 holders", {"aggregator": "bulyan", "min-holders": 7}),
}
LIE_FACTOR = 10


# -- crafting the malicious update ---------------------------------------------------------
def largest_gamma(ok, hi: float = 1e6) -> float:
    """The largest gamma in [0, hi] with ok(gamma), ok monotone (bisection, 60 steps)."""
    lo = 0.0
    if ok(hi):
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def craft_tensor(attack: str, own: np.ndarray, honest: list[np.ndarray], holders: int,
                 fewest: int, z: float = 1.5, epsilon: float = 2.0) -> np.ndarray:
    """The attacker's update of one tensor (module docstring). ``own``: its honest update;
    ``honest``: the honest holders' updates; ``holders``: how many clients hold the tensor;
    ``fewest``: the smallest number of holders of any tensor this round."""
    ref = np.stack(honest) if honest else own[None]
    mu, sigma = ref.mean(axis=0), ref.std(axis=0)
    if attack == "alie":
        return mu - z * sigma
    if attack == "ipm":
        return -epsilon * mu
    if attack in ("flip-in-bound", "lie"):
        return -1e3 * own  # screening decides how far: inside_screening shrinks it
    if attack == "fewest":
        return -1e3 * mu if holders <= max(fewest, 2) else own
    p = -mu / max(norm(mu), 1e-30)
    if attack == "min-max":
        limit = max((norm(a - b) for a in ref for b in ref), default=0.0)
        ok = lambda g: max(norm(mu + g * p - d) for d in ref) <= limit  # noqa: E731
    else:  # min-sum
        limit = max(sum(norm(a - b) ** 2 for b in ref) for a in ref)
        ok = lambda g: sum(norm(mu + g * p - d) ** 2 for d in ref) <= limit  # noqa: E731
    return mu + largest_gamma(ok) * p


def inside_screening(crafted: dict[str, dict[str, np.ndarray]], others: list[ClientUpdate],
                     sent: dict[str, dict[str, np.ndarray]], robust: RobustConfig,
                     reach: dict[str, dict[str, float]] | None = None) -> dict:
    """Shrink, x 0.8 at a time, each attacker's tensors that screening would reject, until no
    attacker is rejected (the attacker knows the bounds and the other updates). ``crafted``:
    attacker -> name -> update; ``reach``: screening's bound of each attacker's training reach
    (``robust.screen``); returns the same with the accepted updates."""
    if not robust.screen_updates:
        return crafted
    reach = reach or {}
    crafted = {a: dict(t) for a, t in crafted.items()}
    honest = {}  # name -> the honest holders' update norms
    for u in others:
        for n, v in u.tensors.items():
            honest.setdefault(n, []).append(norm(v.astype(np.float64) - sent[u.client][n]))
    for _ in range(200):
        norms = {n: list(v) for n, v in honest.items()}
        for t in crafted.values():
            for n, d in t.items():
                norms.setdefault(n, []).append(norm(d))
        bad = [(a, n) for a, t in crafted.items() for n, d in t.items()
               if screen_verdict(rms(d), rms(sent[a][n]), norm(d), float(np.median(norms[n])),
                                 len(norms[n]), robust, reach=reach.get(a, {}).get(n))]
        if not bad:
            ups = others + [ClientUpdate(a, {n: sent[a][n] + d for n, d in t.items()}, 1)
                            for a, t in crafted.items()]
            assert not set(screen(ups, sent, robust, reach=reach)) & set(crafted)
            return crafted
        for a, n in bad:
            crafted[a][n] = crafted[a][n] * 0.8
    raise RuntimeError("could not craft an update that screening accepts")


def craft_round(attack: str, attackers: list[str], updates: dict[str, dict[str, np.ndarray]],
                sent: dict[str, dict[str, np.ndarray]], robust: RobustConfig, z: float = 1.5,
                epsilon: float = 2.0, reach: dict[str, dict[str, float]] | None = None
                ) -> dict[str, dict[str, np.ndarray]]:
    """Attacker -> its malicious update (name -> Delta) for one round; ``updates``: every
    client's honest update this round (client -> name -> Delta), ``sent``: what each got,
    ``reach``: screening's training-reach bounds of each attacker's tensors."""
    holders: dict[str, int] = {}
    for tensors in updates.values():
        for name in tensors:
            holders[name] = holders.get(name, 0) + 1
    fewest = min(holders.values())
    crafted = {}
    for a in attackers:
        crafted[a] = {n: craft_tensor(attack, own, [updates[c][n] for c in updates
                                                    if c not in attackers and n in updates[c]],
                                      holders[n], fewest, z, epsilon)
                      for n, own in updates[a].items()}
    others = [ClientUpdate(c, {n: sent[c][n] + d for n, d in t.items()}, 1)
              for c, t in updates.items() if c not in attackers]
    return inside_screening(crafted, others, sent, robust, reach)


def renamed(reply: Message, old: Message) -> Message:
    """``reply`` under the message id the grid gave ``old``."""
    reply.metadata.__dict__["_message_id"] = old.metadata.message_id
    return reply


# -- the grid that lets the attackers see the round ------------------------------------------
class AttackGrid(InProcessGrid):
    """The in-process grid; after every client trained, the attackers' replies are replaced by
    the crafted ones (full knowledge of the round's honest updates)."""

    def __init__(self, client_app, node_configs, run_config, cfg: RunConfig, attack: str,
                 attackers: list[int], z: float = 1.5, epsilon: float = 2.0):
        super().__init__(client_app, node_configs, run_config)
        self.cfg, self.attack, self.attackers = cfg, attack, attackers
        self.z, self.epsilon = z, epsilon
        self.recipe = global_recipe(cfg)  # the server's: screening's reach bounds
        self.crafted: list[dict] = []  # per round: attacker -> name -> Delta (for the tests)

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        by_pid = {self.node_ids.index(m.metadata.dst_node_id): m for m in messages}
        replies = {pid: self._replies[m.metadata.message_id] for pid, m in by_pid.items()}
        kind = messages[0].metadata.message_type if messages else None
        if kind == MessageType.QUERY and self.attack == "lie":
            for pid in self.attackers:
                if pid in replies and replies[pid]:
                    answer = NodeAnswer.from_message(replies[pid][0])
                    lie = replace(answer, num_examples=LIE_FACTOR * answer.num_examples)
                    replies[pid][0] = renamed(Message(lie.to_content(), reply_to=by_pid[pid]),
                                              replies[pid][0])
        if kind != MessageType.TRAIN:
            return ids
        sent = {str(p): from_record(m.content[ARRAYS]) for p, m in by_pid.items()}
        trained = {str(p): from_record(r[0].content[ARRAYS]) for p, r in replies.items()
                   if r and not r[0].has_error()}
        updates = {c: {n: v.astype(np.float64) - sent[c][n] for n, v in t.items()}
                   for c, t in trained.items()}
        attackers = [str(a) for a in self.attackers if str(a) in updates]
        if not attackers:
            return ids
        factor = LIE_FACTOR if self.attack == "lie" else 1
        reach = {}
        for a in attackers:
            task = TrainTask.from_message(by_pid[int(a)])
            examples = factor * int(TrainReply.from_message(replies[int(a)][0]).num_examples)
            reach[a] = self.recipe.update_bounds(sent[a], examples, task.server_round,
                                                 task.max_batches)
        crafted = craft_round(self.attack, attackers, updates, sent, self.cfg.robust, self.z,
                              self.epsilon, reach)
        self.crafted.append(crafted)
        for a, tensors in crafted.items():
            old = replies[int(a)][0]
            answer = TrainReply.from_message(old)
            answer = replace(answer, num_examples=factor * int(answer.num_examples))
            values = {n: (sent[a][n] + d).astype(sent[a][n].dtype) for n, d in tensors.items()}
            crafted_reply = replace(answer, arrays=to_record(values))
            replies[int(a)][0] = renamed(crafted_reply.to_message(by_pid[int(a)]), old)
        return ids


def drop_training(pids) -> dict:
    """The in-process grid loses every training reply of these clients."""
    return {pid: lambda msg, reply: None if msg.metadata.message_type == MessageType.TRAIN
            else reply for pid in pids}


def client_app():
    from fedtune_app.apps.client_app import app  # the app's own ClientApp

    return app


def one_run(run_config: dict, out: Path, attack: str = "", attackers=(), dropped=False,
            **knobs) -> dict:
    rc = run_config | {"results-dir": str(out)}
    if attack in CRUDE:
        rc = rc | {"fault-injection": ",".join(f"{attack}={a}" for a in attackers)}
    cfg = resolve_config(rc)
    nodes = simulation_nodes(num_clients(cfg))
    if attack in ADAPTIVE:
        grid = AttackGrid(client_app(), nodes, rc, cfg, attack, list(attackers), **knobs)
    else:
        grid = InProcessGrid(client_app(), nodes, rc, drop_training(attackers) if dropped
                             else None)
    folder = Path(run_federation(grid, cfg))
    metrics = json.loads((folder / "metrics.json").read_text())
    accuracy = [m["accuracy"] for m in metrics if m["accuracy"] is not None][-1]
    rejected = [int(p) for m in metrics for p in m["rejected"]]
    return {"folder": str(folder), "accuracy": accuracy,
            "rejected-attackers": sum(p in attackers for p in rejected),
            "rejected-honest": sum(p not in attackers for p in rejected)
            if not dropped else 0,
            "kept": sum(1 for m in metrics if not m["state-updated"])}


def distance(folder: str, reference: str, initial: dict) -> float:
    a, b = load_file(f"{folder}/state.safetensors"), load_file(f"{reference}/state.safetensors")
    num = sum(np.sum((a[n].astype(np.float64) - b[n]) ** 2) for n in b)
    den = sum(np.sum((b[n].astype(np.float64) - initial[n]) ** 2) for n in b)
    return float(np.sqrt(num / den))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-config", default='preset="smoke"')
    parser.add_argument("--attackers", default="0", help="partition ids, comma separated")
    parser.add_argument("--attacks", default=",".join(CRUDE + ADAPTIVE))
    parser.add_argument("--defences", default="before,default",
                        help=f"columns, comma separated: {', '.join(DEFENCES)}")
    parser.add_argument("--z", type=float, default=1.5, help="alie: z")
    parser.add_argument("--epsilon", type=float, default=2.0, help="ipm: epsilon")
    parser.add_argument("--out", default="results/attacks")
    args = parser.parse_args(argv)
    setup_logging()
    attackers = [int(a) for a in args.attackers.split(",")]
    base = parse_config_args([args.run_config])
    out = Path(args.out)
    cfg = resolve_config(base)
    model, recipe = build_global(cfg)
    initial = recipe.initial_state(model, cfg.seed)  # what the server starts from
    results: dict = {}
    for d in args.defences.split(","):
        keys = base | DEFENCES[d][1]
        col = results[d] = {"honest": one_run(keys, out / d / "honest"),
                            "dropped": one_run(keys, out / d / "dropped", "", attackers, True)}
        for attack in args.attacks.split(","):
            r = col[attack] = one_run(keys, out / d / attack, attack, attackers,
                                      **({"z": args.z, "epsilon": args.epsilon}
                                         if attack in ADAPTIVE else {}))
            r["distance"] = distance(r["folder"], col["dropped"]["folder"], initial)
        (out / "attacks.json").write_text(json.dumps(results, indent=1))
    write_table(results, args, out)


def write_table(results: dict, args, out: Path) -> None:
    defences = list(results)
    lines = [f"attackers {args.attackers}; each cell: final accuracy, accuracy minus the "
             "dropped run's (points), distance to the dropped run, replies rejected "
             "(attackers/honest)", "",
             "| attack | " + " | ".join(DEFENCES[d][0] for d in defences) + " |",
             "|---" * (len(defences) + 1) + "|",
             "| honest run | " + " | ".join(f"{results[d]['honest']['accuracy']:.3f}"
                                            for d in defences) + " |",
             "| attackers dropped | " + " | ".join(f"{results[d]['dropped']['accuracy']:.3f}"
                                                   for d in defences) + " |"]
    for attack in args.attacks.split(","):
        cells = []
        for d in defences:
            r, ref = results[d][attack], results[d]["dropped"]["accuracy"]
            cells.append(f"{r['accuracy']:.3f} ({100 * (r['accuracy'] - ref):+.1f}), "
                         f"{r['distance']:.3g}, rej {r['rejected-attackers']}/"
                         f"{r['rejected-honest']}")
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "attacks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
