"""HetLoRA: heterogeneous LoRA ranks with zero-padding, rank self-pruning and sparsity-weighted
aggregation (Cho et al., EMNLP 2024).

The global LoRA has rank R (lora-r, the largest client rank). Per round t:
  1. distribution by truncation: client k gets the first r_k components of the global factors
     (B[:, :r_k], A[:r_k, :]);
  2. local training with rank self-pruning: the loss gets lambda ||B_p A_p||_F, the norm of the
     update its last components p = floor(gamma r_k)..r_k-1 make; if that norm is smaller after
     training than before it, the client prunes them and its rank becomes floor(gamma r_k) from
     then on (it sends back the first floor(gamma r_k) components);
  3. sparsity-weighted aggregation: the replies are zero-padded to rank R and averaged with
     weights p_k = ||B_k A_k||_F / sum_j ||B_j A_j||_F, per adapted Linear over the clients that
     held it: A = sum_k p_k pad(A_k), B = sum_k p_k pad(B_k) (a component only larger ranks hold
     is averaged with the zeros of the smaller ones: HetLoRA's zero-padding).

Choices made here: the norms are per adapted Linear (the paper writes one Delta W_k); a round in
which every holder's product is zero (B = 0 at start) falls back to |D_k| weights; the pruning
test compares the summed norm of all the client's pruned parts before and after its training.
The paper's values of gamma and lambda could not be read offline here: 'hetlora-gamma' and
'hetlora-lambda' are this module's defaults, set them to the paper's before citing a number.
A client's pruned rank is server state (kept in the checkpoint); a pruned reply is accepted at
any rank from 1 to what it was sent, one rank for all its factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedtune_app.config import ConfigPart, config_key
from fedtune_app.methods.lora_ranks import (
    A,
    B,
    RankRecipe,
    RankStrategy,
    check_exact,
    check_rank_method,
    factor,
    holder_weights,
    lora_modules,
    pad,
    product,
    rank_of,
)
from fedtune_app.methods.registry import register_method


def kept_rank(rank: int, gamma: float) -> int:
    """The rank a client keeps if it prunes: floor(gamma r) (at least 1)."""
    return max(1, math.floor(gamma * rank))


def sparsity_weights(updates, module: str, by: str = "sparsity") -> list[tuple[object, float]]:
    """Step 3's p_k over the module's holders: ||B_k A_k||_F normalised, or |D_k|."""
    held = holder_weights(updates, module)
    if by == "examples":
        return held
    norms = [float(np.linalg.norm(product(u.tensors, module))) for u, _ in held]
    total = sum(norms)
    if total == 0.0:
        return held
    return [(u, s / total) for (u, _), s in zip(held, norms)]


class HetLoRA(RankStrategy):
    name = "hetlora"
    private_aggregation = False  # its weights are norms of every client's update

    def __init__(self, cfg, clients, num_layers, initial_state):
        self.pruned: dict[int, int] = {}  # partition id -> its rank after self-pruning
        super().__init__(cfg, clients, num_layers, initial_state)

    def rank(self, client):
        declared = super().rank(client)
        return min(declared, self.pruned.get(client.partition_id, declared))

    def received_tensors(self, client, tensors):
        """A reply at any one rank 1..r (step 2's pruning), remembered for the next rounds."""
        sent = self.round_ranks[client.partition_id]
        ranks = {rank_of(n, v) for n, v in tensors.items() if factor(n) and v.ndim == 2}
        if len(ranks) == 1 and 1 <= (r := ranks.pop()) <= sent:
            self.round_ranks[client.partition_id] = r
        tensors = super().received_tensors(client, tensors)
        if self.round_ranks[client.partition_id] < sent:
            self.pruned[client.partition_id] = self.round_ranks[client.partition_id]
        return tensors

    def aggregate(self, updates):
        new = self.plain_mean(updates)  # the head
        for module in lora_modules(self.state):
            weights = sparsity_weights(updates, module, self.cfg.own.hetlora_weighting)
            if not weights:
                continue
            for suffix in (A, B):
                total = sum(p * pad(module + suffix, u.tensors[module + suffix], self.top)
                            .astype(np.float64) for u, p in weights)
                new[module + suffix] = total.astype(np.float32)
        return self.server_objective(updates, new)

    def extra_state(self):
        return super().extra_state() | {f"hetlora-rank/{pid}": np.array(r)
                                        for pid, r in self.pruned.items()}

    def load_extra_state(self, tensors):
        super().load_extra_state(tensors)
        self.pruned = {int(k.removeprefix("hetlora-rank/")): int(v) for k, v in tensors.items()
                       if k.startswith("hetlora-rank/")}


class HetLoRARecipe(RankRecipe):
    """Step 2 on the client: the self-pruning term and the pruning test."""

    # the self-pruning term does not involve the head: its bias's gradient is cross-entropy's
    gradient_bounds: dict[str, float] = {"head.bias": math.sqrt(2)}

    def pruned_norm(self) -> torch.Tensor:
        """sum over the plan's adapted Linears of ||B_p A_p||_F, p the last components."""
        keep = kept_rank(self.rank, self.cfg.own.hetlora_gamma)
        if keep == self.rank:
            return torch.zeros(())
        return sum((b[:, keep:self.rank] @ a[keep:self.rank]).norm() for a, b in self.pairs)

    def assign(self, model, plan, received):
        super().assign(model, plan, received)
        with torch.no_grad():
            self.before = float(self.pruned_norm())

    def loss(self, model, plan, inputs, labels):
        return super().loss(model, plan, inputs, labels) \
            + self.cfg.own.hetlora_lambda * self.pruned_norm()

    def reply_rank(self):
        with torch.no_grad():
            after = float(self.pruned_norm())
        keep = kept_rank(self.rank, self.cfg.own.hetlora_gamma)
        return keep if keep < self.rank and after < self.before else self.rank


@dataclass(frozen=True)
class HetLoRAConfig(ConfigPart):
    """HetLoRA's own keys."""
    hetlora_gamma: float = config_key(0.99, minimum=0, maximum=1, help=
        "HetLoRA rank self-pruning: a client that prunes keeps floor(gamma r) of its r "
        "components (the regularised, prunable ones are the rest)")
    hetlora_lambda: float = config_key(0.01, minimum=0, help=
        "HetLoRA rank self-pruning: weight lambda of the norm of the prunable components' "
        "update in the local loss (0 = no regularisation; pruning still follows the norm)")
    hetlora_weighting: str = config_key("sparsity", choices=("sparsity", "examples"), help=
        "HetLoRA aggregation weights: ||B_k A_k||_F normalised (sparsity-weighted, the paper) "
        "or |D_k| (plain zero-padding)")


def check(cfg):
    check_rank_method(cfg)
    check_exact(cfg)


register_method("hetlora", strategy=HetLoRA, recipe=HetLoRARecipe, check=check,
                config=HetLoRAConfig)
