"""DepthFL: depth-wise federated learning for heterogeneous clients (Kim et al., ICLR'23).

The L-block model gets an exit classifier after every k blocks: exit depths
D = {k, 2k, ...} and L (the model's own head is the exit at depth L; the others are new linear
heads ``exits.<depth>.weight/bias`` on the same pooled features as the head). A client of
capacity L_i holds a prefix of depth d_i and the exits inside it; it gets and returns only
those tensors. Two ways to set d_i (``depthfl-client-depth``):
  * ``capacity`` (default; how the FedRA and FedBRICK papers ran DepthFL, as the FedRA code
    does): d_i = L_i, the exits at depths in D below d_i, and the model's head as the exit at
    d_i. No client loses a layer, so DepthFL gets the same compute as every other method.
  * ``exit-depth`` (DepthFL's own stages): d_i = max{d in D : d <= L_i} with the exits at
    depths <= d_i (the head only when d_i = L); a capacity below k holds no exit.
Under dynamic capacities d_i follows the round's drawn L_i (a drawn L_i below k sits the round
out under ``exit-depth``).

Client (DepthFL Sec. 3, Eq. 3, self-distillation from Deep Mutual Learning), with z_1..z_n the
logits of the client's n exits and p_j = softmax(z_j):
    loss = sum_i CE(y, z_i) + w_t/(n-1) * sum_i sum_{j != i} KL(p_j || p_i)     (n > 1)
with p_j detached inside KL(p_j || p_i) (each exit learns from the others, not vice versa),
temperature 1, and the consistency weight of round t (1-based)
    w_t = exp(-5 (1 - min(t - 1, T) / T)^2),   T = ``depthfl-consistency-ramp``
(the FedRA code's ``consistency_weight``, T = 500; Flower's DepthFL baseline uses T = 300;
T = 0 is a constant w = 1).
Optimizer (``depthfl-optimizer``): FedAvg by default, the setting of FedRA Sec. 4.1 ("We
default to using FedAvg") and FedBRICK ("standard FedAvg"), whose tables the presets
reproduce; ``local-objective`` then applies as for every method. ``feddyn`` is DepthFL's own
paper setting: FedDyn (Acar et al., ICLR'21), the shared one of ``objectives.py`` (client term
with the node's h_i, server correction per tensor scaled by the share of clients that held it),
alpha = ``depthfl-feddyn-alpha``.
Server: every tensor (blocks, exits, head) is the example-weighted mean over the clients that
hold it (a tensor nobody held keeps its value), then the objective's server step (FedDyn's).
Inference: the global model runs the prefix of the deepest client depth, with every exit up to
it. Every evaluation records both scores, ``accuracy-ensemble`` (the mean of the exits' softmax
probabilities, DepthFL's own paper) and ``accuracy-last-exit`` (the deepest exit alone, what the
official FedRA code scores), and each exit (``accuracy-exit-<d>``); ``depthfl-headline`` picks
which of the two is the run's ``accuracy`` (the FedRA and FedBRICK presets: last-exit).

Choices made here (not fixed by the paper, which uses ResNets with 4 stages):
  * k = ``depthfl-exit-every``; 0 = auto k = max(1, L // 4): four exits like DepthFL's four
    stages on a 12-block ViT (k = 3, as FedRA Sec. 4.1: "every three layers of ViT as a
    block"; the FedRA code's exits sit after blocks 4, 7, 10, one block later); for a 6-block
    text encoder (MiniLM) k = 1.
  * An exit is a linear head on the model's own (frozen) final norm + pooling; DepthFL's ResNet
    exits have extra bottleneck layers. The ensemble averages probabilities (the Flower
    baseline averages logits; the FedRA code evaluates the last exit alone). KL without the
    baseline's +1e-7 smoothing of the target.
  * Server means are example-weighted (FedDyn's and the baseline's are unweighted).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

from fedtune_app.config import ConfigError, ConfigPart, RunConfig, config_key
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.federated.wire import SERVER_ROUND
from fedtune_app.methods.registry import register_method
from fedtune_app.model.adapters import add_trained_module, block_of, names_for_plan
from fedtune_app.training.recipes import ClientRecipe

log = logging.getLogger("fedtune")


def exit_every(cfg: RunConfig, num_layers: int) -> int:
    return cfg.own.depthfl_exit_every or max(1, num_layers // 4)


def exit_depths(num_layers: int, k: int) -> tuple[int, ...]:
    """Depths (blocks run) after which an exit sits: k, 2k, ... and always L."""
    return tuple(sorted(set(range(k, num_layers + 1, k)) | {num_layers}))


def head_at_own_depth(cfg: RunConfig) -> bool:
    return cfg.own.depthfl_client_depth == "capacity"


def client_depth(capacity: int, depths, own_depth: bool = False) -> int:
    """Blocks a client of this capacity holds (``own_depth``: all of them)."""
    if own_depth:
        return capacity
    held = [d for d in depths if d <= capacity]
    if not held:
        raise ConfigError(f"run-config key 'capacities': capacity {capacity} holds no DepthFL "
                          f"exit (exits after {list(depths)} blocks); lower "
                          f"'depthfl-exit-every' to at most {capacity}, raise the capacity, "
                          "or set 'depthfl-client-depth' = 'capacity'")
    return max(held)


def exits_run(depth: int, depths, num_layers: int, own_depth: bool) -> list[int]:
    """Depths at which a depth-``depth`` model has an exit, shallowest first (the last one is
    the model's head when ``own_depth`` or depth = L, else ``exits.<depth>``)."""
    below = [d for d in depths if d < depth]
    return below + [depth] if own_depth or depth in depths else below


def holds(name: str, depth: int, num_layers: int, own_depth: bool = False) -> bool:
    """Is tensor ``name`` part of a depth-``depth`` client's model?"""
    head_last = own_depth or depth == num_layers
    if name.startswith("exits."):
        d = int(name.split(".")[1])
        return d < depth or (d == depth and not head_last)
    if name.startswith("head."):
        return head_last
    block = block_of(name)
    return block is None or block < depth


def consistency_weight(server_round: int, ramp: int) -> float:
    """w_t = exp(-5 (1 - min(t-1, T)/T)^2) (T = 0: 1)."""
    if not ramp:
        return 1.0
    phase = 1.0 - min(server_round - 1, ramp) / ramp
    return math.exp(-5.0 * phase * phase)


def exit_outputs(model, inputs, plan, depths, own_depth: bool = False) -> list[torch.Tensor]:
    """Logits of every exit along the (prefix) plan, shallowest first."""
    x, ctx = model.embed(inputs)
    out = []
    for n, j in enumerate(plan, 1):
        x = model.run_block(model.blocks[j], x, ctx)
        if n == len(plan) and (own_depth or n == model.num_blocks):
            out.append(model.classify(x, ctx))
        elif n in depths and n < model.num_blocks:
            dropout = getattr(model, "dropout", nn.Identity())  # as the head has it (HF)
            out.append(model.exits[str(n)](dropout(model.pre_logits(x, ctx))))
    return out


def self_distillation_loss(logits: list[torch.Tensor], labels: torch.Tensor,
                           weight: float = 1.0) -> torch.Tensor:
    """sum_i CE(y, z_i) + w/(n-1) sum_i sum_{j!=i} KL(p_j || p_i), p_j detached; batch mean."""
    loss = sum(nn.functional.cross_entropy(z, labels) for z in logits)
    n = len(logits)
    if n > 1:
        log_p = [nn.functional.log_softmax(z, -1) for z in logits]
        for i in range(n):
            for j in range(n):
                if j != i:
                    target = log_p[j].detach()
                    kl = (target.exp() * (target - log_p[i])).sum(-1).mean()
                    loss = loss + weight * kl / (n - 1)
    return loss


def ensemble_log_probs(logits: list[torch.Tensor]) -> torch.Tensor:
    """log of the mean of the exits' softmax probabilities."""
    probs = torch.stack([nn.functional.softmax(z, -1) for z in logits]).mean(0)
    return probs.log()


class DepthFLRecipe(ClientRecipe):
    """Exits on the model, the self-distillation loss, ensemble inference."""

    gradient_bounds: dict[str, float] = {}  # the exits' distillation adds to every head's gradient

    tensor_formulas = {"exits.": "DepthFL exit classifier: Linear on the pooled features after "
                                 "block <d> (exits.<d>); prediction = mean over exits and head "
                                 "of log_softmax"}
    predicting_tensors = ("exits.",)

    def cache_key(self):
        return (self.cfg.own.depthfl_exit_every,)

    @property
    def own_depth(self) -> bool:
        return head_at_own_depth(self.cfg)

    def depths(self, model) -> tuple[int, ...]:
        return exit_depths(model.num_blocks, exit_every(self.cfg, model.num_blocks))

    def extend(self, model):
        head = model.head
        add_trained_module(model, "exits", nn.ModuleDict({
            str(d): nn.Linear(head.in_features, head.out_features)
            for d in self.depths(model) if d < model.num_blocks}), init="classifier")
        return model

    def trainables(self, model, plan):
        return {n: p for n, p in super().trainables(model, plan).items()
                if holds(n, len(plan), model.num_blocks, self.own_depth)}

    def loss(self, model, plan, inputs, labels):
        weight = consistency_weight(int(self.round_config[SERVER_ROUND]),
                                    self.cfg.own.depthfl_consistency_ramp)
        return self_distillation_loss(
            exit_outputs(model, inputs, plan, self.depths(model), self.own_depth), labels, weight)

    def eval_logits(self, model, plan, inputs):
        depths = self.depths(model)
        logits = exit_outputs(model, inputs, plan, depths, self.own_depth)
        held = exits_run(len(plan), depths, model.num_blocks, self.own_depth)
        scores = {"ensemble": ensemble_log_probs(logits), "last-exit": logits[-1]}
        return {"": scores[self.cfg.own.depthfl_headline]} | scores | \
            {f"exit-{d}": z for d, z in zip(held, logits)}


class DepthFL(LayerPlanStrategy):
    name = "depthfl"

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.depths = exit_depths(num_layers, exit_every(cfg, num_layers))
        self.own_depth = head_at_own_depth(cfg)
        self.depth_of = {c.partition_id: client_depth(c.capacity, self.depths, self.own_depth)
                         for c in self.clients}  # bad capacities fail here, before training

    @classmethod
    def check_fleet(cls, cfg, capacities, num_layers):
        """Every capacity must also hold an exit (``client_depth``)."""
        super().check_fleet(cfg, capacities, num_layers)
        depths = exit_depths(num_layers, exit_every(cfg, num_layers))
        for capacity in capacities:
            client_depth(capacity, depths, head_at_own_depth(cfg))

    def admit(self, client):
        self.depth_of[client.partition_id] = client_depth(client.capacity, self.depths,
                                                          self.own_depth)

    def round_clients(self, clients):
        """This round's capacities (drawn ones under dynamic heterogeneity); under
        ``exit-depth`` a client whose drawn capacity holds no exit sits the round out."""
        clients = super().round_clients(clients)
        if self.own_depth:
            return clients
        out = [c for c in clients if c.capacity >= self.depths[0]]
        if len(out) < len(clients):
            log.info("depthfl: clients %s hold no exit this round (capacity < %d) and sit it out",
                     [c.partition_id for c in clients if c not in out], self.depths[0])
        return out

    def plan_round(self, server_round, clients):
        return [tuple(range(client_depth(c.capacity, self.depths, self.own_depth)))
                for c in clients]

    def payload(self, plan):
        return [n for n in names_for_plan(self.state, plan)
                if holds(n, len(plan), self.num_layers, self.own_depth)]

    def eval_plan(self):
        return tuple(range(max(self.depth_of.values())))


@dataclass(frozen=True)
class DepthFLConfig(ConfigPart):
    """DepthFL's own keys."""
    depthfl_exit_every: int = config_key(0, minimum=0, help=
        "DepthFL: an exit classifier after every k blocks (0 = auto: k = max(1, L // 4), i.e. 3 "
        "for 12 blocks, 1 for 6 blocks)")
    depthfl_client_depth: str = config_key("capacity", choices=('capacity', 'exit-depth'), help=
        "DepthFL: a client holds all its L_i blocks with the model's head as its exit at depth L_i"
        " (capacity: as the FedRA and FedBRICK papers ran it), or L_i is rounded down to an exit "
        "depth (exit-depth: DepthFL's own stages)")
    depthfl_consistency_ramp: int = config_key(500, minimum=0, help=
        "DepthFL: the self-distillation weight in round t is exp(-5 (1 - min(t-1, T)/T)^2) with T "
        "this many rounds (500: the FedRA code; 300: Flower's DepthFL baseline; 0 = a constant "
        "weight 1)")
    depthfl_optimizer: str = config_key("fedavg", choices=('fedavg', 'feddyn'), help=
        "DepthFL's federated optimizer: FedAvg (as the FedRA and FedBRICK papers ran every method;"
        " 'local-objective' then applies) or FedDyn (DepthFL's own paper)")
    depthfl_headline: str = config_key("ensemble", choices=('ensemble', 'last-exit'), help=
        "DepthFL: which score is the run's 'accuracy' (both are recorded every evaluation): the "
        "ensemble of the exits (DepthFL's own paper) or the last exit alone (the official FedRA "
        "code, whose numbers FedRA's tables report; set by the FedRA and FedBRICK presets)")
    depthfl_feddyn_alpha: float = config_key(0.1, minimum=1e-06, help=
        "FedDyn regularisation alpha (as DepthFL's Flower baseline)")


def depthfl_objective(run) -> tuple[str, float] | None:
    """DepthFL with ``depthfl-optimizer = feddyn`` (its own paper's setting) trains with FedDyn;
    with ``fedavg`` (the default, as the FedRA and FedBRICK papers ran it) it follows
    ``local-objective`` (None)."""
    if run.own.depthfl_optimizer != "feddyn":
        return None
    kind = run.training.local_objective
    if kind != "plain":
        raise ConfigError(f"run-config keys 'depthfl-optimizer' = 'feddyn' and "
                          f"'local-objective' = {kind!r} contradict each other; set "
                          "'depthfl-optimizer' = 'fedavg' to use 'local-objective', or "
                          "'local-objective' = 'plain'")
    return "feddyn", run.own.depthfl_feddyn_alpha


register_method("depthfl", strategy=DepthFL, recipe=DepthFLRecipe, config=DepthFLConfig,
                objective=depthfl_objective)
