"""DepthFL: depth-wise federated learning for heterogeneous clients (Kim et al., ICLR'23).

The L-block model gets an exit classifier after every k blocks: exit depths
D = {k, 2k, ...} and L (the model's own head is the exit at depth L; the others are new linear
heads ``exits.<depth>.weight/bias`` on the same pooled features as the head). A client of
capacity L_i holds the prefix of depth d_i = max{d in D : d <= L_i} (its "local model" of
d_i / k stages) and the exits at depths <= d_i; it gets and returns only those tensors.

Client (DepthFL Sec. 3, Eq. 3, self-distillation from Deep Mutual Learning), with z_1..z_n the
logits of the client's n exits and p_j = softmax(z_j):
    loss = sum_i CE(y, z_i) + 1/(n-1) * sum_i sum_{j != i} KL(p_j || p_i)     (n > 1)
with p_j detached inside KL(p_j || p_i) (each exit learns from the others, not vice versa)
and temperature 1. Optimizer: FedDyn (Acar et al., ICLR'21; DepthFL trains with it), the
shared one of ``objectives.py`` (client term with the node's h_i, server correction per tensor
scaled by the share of clients that held it), alpha = ``depthfl-feddyn-alpha``;
``depthfl-optimizer = fedavg`` leaves the choice to ``local-objective`` (default plain).
Server: every tensor (blocks, exits, head) is the example-weighted mean over the clients that
hold it (a tensor nobody held keeps its value), then FedDyn's correction.
Inference: ensemble of the exits, the mean of their softmax probabilities (the global model
runs the prefix of the deepest client depth, with every exit up to it); the last exit alone and
each exit are reported too (``accuracy-last-exit``, ``accuracy-exit-<d>``).

Choices made here (not fixed by the paper, which uses ResNets with 4 stages):
  * k = ``depthfl-exit-every``; 0 = auto k = max(1, L // 4): four exits like DepthFL's four
    stages on a 12-block ViT (k = 3); for a 6-block text encoder (MiniLM) k = 1, an exit after
    every block, so each capacity 1..6 is a whole number of stages and no client loses a layer.
  * A capacity between two exit depths is rounded down to the shallower one; a capacity below k
    is an error (that client could hold no exit).
  * An exit is a linear head on the model's own (frozen) final norm + pooling; DepthFL's ResNet
    exits have extra bottleneck layers. The ensemble averages probabilities (the Flower
    baseline averages logits). KL without the baseline's +1e-7 smoothing of the target.
  * Server means are example-weighted (FedDyn's and the baseline's are unweighted).
"""

from __future__ import annotations

import torch
from torch import nn

from fedtune_app.model.adapters import block_of, names_for_plan
from fedtune_app.config import ConfigError
from fedtune_app.training.recipes import ClientRecipe
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.config import Key
from fedtune_app.methods.registry import register_method


def exit_every(cfg: dict, num_layers: int) -> int:
    return cfg["depthfl-exit-every"] or max(1, num_layers // 4)


def exit_depths(num_layers: int, k: int) -> tuple[int, ...]:
    """Depths (blocks run) after which an exit sits: k, 2k, ... and always L."""
    return tuple(sorted(set(range(k, num_layers + 1, k)) | {num_layers}))


def client_depth(capacity: int, depths) -> int:
    held = [d for d in depths if d <= capacity]
    if not held:
        raise ConfigError(f"run-config key 'capacities': capacity {capacity} holds no DepthFL "
                          f"exit (exits after {list(depths)} blocks); lower "
                          f"'depthfl-exit-every' to at most {capacity} or raise the capacity")
    return max(held)


def holds(name: str, depth: int, num_layers: int) -> bool:
    """Is tensor ``name`` part of a depth-``depth`` client's model?"""
    if name.startswith("exits."):
        return int(name.split(".")[1]) <= depth
    if name.startswith("head."):
        return depth == num_layers
    block = block_of(name)
    return block is None or block < depth


def exit_outputs(model, inputs, plan, depths) -> list[torch.Tensor]:
    """Logits of every exit along the (prefix) plan, shallowest first."""
    x, ctx = model.embed(inputs)
    out = []
    for n, j in enumerate(plan, 1):
        x = model.run_block(model.blocks[j], x, ctx)
        if n == model.num_blocks:
            out.append(model.classify(x, ctx))
        elif n in depths:
            dropout = getattr(model, "dropout", nn.Identity())  # as the head has it (HF)
            out.append(model.exits[str(n)](dropout(model.pre_logits(x, ctx))))
    return out


def self_distillation_loss(logits: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """sum_i CE(y, z_i) + 1/(n-1) sum_i sum_{j!=i} KL(p_j || p_i), p_j detached; batch mean."""
    loss = sum(nn.functional.cross_entropy(z, labels) for z in logits)
    n = len(logits)
    if n > 1:
        log_p = [nn.functional.log_softmax(z, -1) for z in logits]
        for i in range(n):
            for j in range(n):
                if j != i:
                    target = log_p[j].detach()
                    kl = (target.exp() * (target - log_p[i])).sum(-1).mean()
                    loss = loss + kl / (n - 1)
    return loss


def ensemble_log_probs(logits: list[torch.Tensor]) -> torch.Tensor:
    """log of the mean of the exits' softmax probabilities."""
    probs = torch.stack([nn.functional.softmax(z, -1) for z in logits]).mean(0)
    return probs.log()


class DepthFLRecipe(ClientRecipe):
    """Exits on the model, the self-distillation loss, ensemble inference."""

    def cache_key(self):
        return (self.cfg["depthfl-exit-every"],)

    def depths(self, model) -> tuple[int, ...]:
        return exit_depths(model.num_blocks, exit_every(self.cfg, model.num_blocks))

    def extend(self, model):
        head = model.head
        model.exits = nn.ModuleDict({str(d): nn.Linear(head.in_features, head.out_features)
                                     for d in self.depths(model) if d < model.num_blocks})
        model.exits.requires_grad_(True)
        return model

    def trainables(self, model, plan):
        return {n: p for n, p in super().trainables(model, plan).items()
                if holds(n, len(plan), model.num_blocks)}

    def loss(self, model, plan, inputs, labels):
        return self_distillation_loss(exit_outputs(model, inputs, plan, self.depths(model)),
                                      labels)

    def eval_logits(self, model, plan, inputs):
        depths = self.depths(model)
        logits = exit_outputs(model, inputs, plan, depths)
        held = [d for d in depths if d <= len(plan)]
        return {"": ensemble_log_probs(logits), "last-exit": logits[-1]} | \
            {f"exit-{d}": z for d, z in zip(held, logits)}


class DepthFL(LayerPlanStrategy):
    name = "depthfl"

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.depths = exit_depths(num_layers, exit_every(cfg, num_layers))
        self.depth_of = {c.partition_id: client_depth(c.capacity, self.depths)
                         for c in self.clients}  # bad capacities fail here, before training

    def plan_round(self, server_round, clients):
        return [tuple(range(self.depth_of[c.partition_id])) for c in clients]

    def payload(self, plan):
        return [n for n in names_for_plan(self.state, plan)
                if holds(n, len(plan), self.num_layers)]

    def eval_plan(self):
        return tuple(range(max(self.depth_of.values())))


register_method("depthfl", strategy=DepthFL, recipe=DepthFLRecipe, keys={
    "depthfl-exit-every": Key(0, "DepthFL: an exit classifier after every k blocks (0 = auto: "
                              "k = max(1, L // 4), i.e. 3 for 12 blocks, 1 for 6 blocks)",
                              minimum=0),
    "depthfl-optimizer": Key("feddyn", "DepthFL's federated optimizer: FedDyn (the paper's) or "
                             "plain FedAvg", choices=("feddyn", "fedavg")),
    "depthfl-feddyn-alpha": Key(0.1, "FedDyn regularisation alpha (as DepthFL's Flower "
                                "baseline)", minimum=1e-6),
})
