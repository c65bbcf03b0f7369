"""FedRA: random layer allocation for heterogeneous federated tuning (Su et al., seeds 000/003).

Algorithm (paper Sec. 3.5), per round:
  1. draw M in {0,1}^{N x L} with row sums L_i: client i holds blocks S_i = {j | M_ij = 1};
  2. send client i its sub-network's trainable tensors {r_j}_{j in S_i} and the head (the frozen
     blocks theta_j are NOT sent: every node loads the same pretrained checkpoint itself);
  3. clients tune LoRA/adapters and the head on their data;
  4. r_j = sum_{i: M_ij=1} |D_i| r_j^i / sum_i M_ij |D_i|   (masked weighted mean).
A block no client held: Eq. 2 keeps its previous value (``keep-previous``); Eq. 3 redraws M so
every column has a one (``cover-all``). (v1 of the paper numbers these Eq. 3 and Eq. 4.)

Defaults are the paper's: LoRA on the last fully connected layer of both sublayers of every
block (v1 Sec. 3.2, ``adapter-modules = last-fc``; Table 6's other rows: ``last-fc-attn``,
``last-fc-mlp``), FedAvg, |D_i|-weighted means. The official code differs in two ways the paper
does not describe, available to reproduce its numbers: it caps every client at m + 1 batches
per round, m = the smallest client's number of batches (``fedra-repo-batch-cap``), and its
means are unweighted (``fedra-repo-unweighted``); its Table 2 rounds take one client of each
domain (``client-sampling = per-domain``, set in the T2 presets).
"""

from __future__ import annotations

from fedtune_app.federated.allocation import (
    check_k_cover,
    covering_plans,
    k_cover_plans,
    random_plans,
)
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.methods.registry import register_method


class FedRA(LayerPlanStrategy):
    name = "fedra"
    draws_k_cover = True

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        fed = cfg.federation
        if fed.min_holders > 1:
            per_domain = fed.client_sampling == "per-domain"
            check_k_cover([c.capacity for c in self.clients], num_layers, fed.min_holders,
                          fed.clients_per_round,
                          [c.group for c in self.clients] if per_domain else None,
                          fed.dynamic_capacities)

    def plan_round(self, server_round, clients):
        capacities = [c.capacity for c in clients]
        fed = self.cfg.federation
        if fed.min_holders > 1:  # robustness: k holders per block (federated.robust)
            return k_cover_plans(capacities, self.num_layers, self.rng, fed.min_holders)
        draw = covering_plans if fed.missing_layer_policy == "cover-all" else random_plans
        return draw(capacities, self.num_layers, self.rng)


register_method("fedra", strategy=FedRA)
