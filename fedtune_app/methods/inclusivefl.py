"""InclusiveFL: client-inclusive FL over heterogeneous devices (Liu et al., KDD'22).

Clients are grouped by how many layers they hold; group g holds the first d_g blocks (prefix
allocation), and d_1 < d_2 < ... < d_K are the distinct depths of all clients. Per round t:

  1. client i of group g gets the trainable tensors of blocks 0..d_g-1 and the head, trains
     them with the task loss (the default client recipe), and returns them;
  2. update of client i: D_i = theta_i - theta (theta = the global state it received);
     group update: D_g = sum_{i in g} |D_i| D_i / sum_{i in g} |D_i| (example-weighted);
  3. momentum distillation into the top layer (block d_g - 1) of every group g < K:
         u_g = 1/(d_{g+1} - d_g) * sum_{l = d_g}^{d_{g+1}-1} M_{g+1}[block l]
         D_g[block d_g-1] <- (1 - beta) * D_g[block d_g-1] + beta * u_g
     i.e. the mean update of the layers the next larger group holds above g's top layer is
     passed into that top layer with weight beta (paper: 0.2). Blocks are alike, so the update
     of block l maps tensor by tensor (same suffix, same shape) onto block d_g - 1.
     M_g, the momentum state, is group g's last distilled update (stored after step 3 each round
     the group takes part); a group's teacher signal is thus the larger group's update of the
     previous round it took part in, and knowledge flows down the groups across rounds;
  4. shared layers by example share: theta_n <- theta_n + sum_g N_g D_g[n] / sum_{g holds n} N_g
     (N_g = examples of g's valid replies); a tensor no group sent keeps its value.
  The global model is the full L-block model.
  ``inclusivefl-aggregation = mean`` is InclusiveFL as the official FedRA code runs it (whose
  numbers FedRA's tables report): its main.py aggregates InclusiveFL with ``agg_baseline``, the
  plain mean of each tensor over the clients that hold it (its ``agg_inclusiveFL`` is never
  called): no step 3, and step 4 over clients instead of groups (by examples, or unweighted with
  ``fedra-repo-unweighted``).

Choices the paper leaves open (or that differ from its setting), made here:
  * Step 3 follows the reference implementation of InclusiveFL by the FedRA authors (FedRA repo,
    ``agg_inclusiveFL``): the (1 - beta)/beta mix of the top layer's own update with the mean
    update of the larger group's layers above it, taken from the stored state of the previous
    round. No distillation in a group's first round or before its larger group has a state.
  * The teacher of group g is the next larger group (d_{g+1}), not the largest one.
  * Step 4 weights by examples (FedRA's code averages groups unweighted).
  * One shared head (the FedRA code does the same); the paper's models are full-parameter BERTs,
    here the updates are those of LoRA/adapter tensors named by global block index.
  * Dynamic heterogeneity (FedRA Table 4): the groups are the distinct depths of the round's
    drawn capacities, so step 3 pairs the depths present in the round (a group's teacher is
    the next larger depth present; its signal that depth's stored update M, from the last round
    it took part in). With static capacities the groups are the clients' fixed depths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedtune_app.config import ConfigPart, config_key
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.allocation import prefix_plans
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.methods.registry import register_method
from fedtune_app.model.adapters import block_of


def suffix(name: str) -> str:
    """``blocks.7.output.dense.lora_A.weight`` -> ``output.dense.lora_A.weight``."""
    return name.split(".", 2)[2]


def group_updates(state, updates: list[ClientUpdate], depth_of: dict[str, int], combine=None):
    """Per group depth: (example-weighted mean update per tensor name, total examples).
    ``combine`` (the strategy's robust aggregator, when the run has one) replaces the mean."""
    if combine is not None:
        members: dict[int, list[ClientUpdate]] = {}
        for u in updates:
            members.setdefault(depth_of[u.client], []).append(u)
        deltas = {}
        for g, group in members.items():
            new = combine(group)
            deltas[g] = {n: new[n].astype(np.float64) - state[n]
                         for n in sorted({n for u in group for n in u.tensors})}
        return deltas, {g: sum(u.num_examples for u in group) for g, group in members.items()}
    sums: dict[int, dict[str, np.ndarray]] = {}
    counts: dict[int, int] = {}
    for u in updates:
        g = depth_of[u.client]
        counts[g] = counts.get(g, 0) + u.num_examples
        group = sums.setdefault(g, {})
        for name, value in u.tensors.items():
            delta = value.astype(np.float64) - state[name]
            group[name] = group.get(name, 0.0) + u.num_examples * delta
    return {g: {n: v / counts[g] for n, v in group.items()} for g, group in sums.items()}, counts


def distill(group_delta: dict[int, dict[str, np.ndarray]], momentum: dict[int, dict],
            depths: list[int], beta: float) -> None:
    """Step 3 in place: mix into each present group's top layer the mean of its next larger
    group's stored updates of the layers above it."""
    for small, large in zip(depths, depths[1:]):
        if small not in group_delta or large not in momentum:
            continue
        delta, teacher = group_delta[small], momentum[large]
        for name in [n for n in delta if block_of(n) == small - 1]:
            above = [teacher[f"blocks.{l}.{suffix(name)}"] for l in range(small, large)]
            delta[name] = (1 - beta) * delta[name] + beta * np.mean(above, axis=0)


class InclusiveFL(LayerPlanStrategy):
    name = "inclusivefl"
    private_aggregation = False  # its momentum distillation stores each group's mean update

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.beta = cfg.own.inclusivefl_beta
        self.depths = sorted({min(c.capacity, num_layers) for c in self.clients})
        self.momentum: dict[int, dict[str, np.ndarray]] = {}  # group depth -> last update M_g

    def admit(self, client):  # a late client of a new depth forms a new group
        self.depths = sorted(set(self.depths) | {min(client.capacity, self.num_layers)})

    def plan_round(self, server_round, clients):
        return prefix_plans([c.capacity for c in clients], self.num_layers)

    def aggregate(self, updates):
        if self.cfg.own.inclusivefl_aggregation == "mean":  # the official FedRA code's
            return self.server_objective(updates, self.combine(updates))
        plans = self.history[-1].plans
        depth_of = {u.client: len(plans[int(u.client)]) for u in updates}
        robust = self.combine if self.cfg.robust.aggregator != "mean" else None
        deltas, counts = group_updates(self.state, updates, depth_of, robust)
        dynamic = self.cfg.federation.dynamic_capacities
        depths = sorted({len(p) for p in plans.values()}) if dynamic else self.depths
        distill(deltas, self.momentum, depths, self.beta)
        self.momentum.update(deltas)
        sums, weights = {}, {}
        for g, delta in deltas.items():
            for name, d in delta.items():
                sums[name] = sums.get(name, 0.0) + counts[g] * d
                weights[name] = weights.get(name, 0) + counts[g]
        new = dict(self.state)
        for name, total in sums.items():
            new[name] = (self.state[name] + total / weights[name]).astype(self.state[name].dtype)
        return self.server_objective(updates, new)


@dataclass(frozen=True)
class InclusiveFLConfig(ConfigPart):
    """InclusiveFL's own keys."""
    inclusivefl_aggregation: str = config_key("momentum-distillation", choices=(
        "momentum-distillation", "mean"), help=
        "InclusiveFL's server: its paper's momentum distillation into each group's top layer, or "
        "the plain mean over the clients holding each tensor (mean: how the official FedRA code "
        "runs it for FedRA's tables)")
    inclusivefl_beta: float = config_key(0.2, minimum=0, maximum=1, help=
        "InclusiveFL momentum-distillation weight beta (paper: 0.2)")


register_method("inclusivefl", strategy=InclusiveFL, config=InclusiveFLConfig)
