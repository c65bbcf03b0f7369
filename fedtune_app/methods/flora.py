"""FLoRA: federated fine-tuning with heterogeneous low-rank adaptations by stacking (Wang et
al., NeurIPS 2024).

Per round t:
  1. every client gets FRESH adapters (A Kaiming-uniform, B = 0) of its own rank r_i, on the
     base model as merged so far;
  2. it trains them on its data;
  3. the server stacks the clients' factors, A scaled by p_i = |D_i| / sum_j |D_j|:
         A_stack = [p_1 A_1; p_2 A_2; ...] (sum_i r_i x d_in),  B_stack = [B_1, B_2, ...],
     whose product is exactly B_stack A_stack = sum_i p_i B_i A_i (ranks may differ);
  4. and merges it into the base weight: W0 <- W0 + s B_stack A_stack.
The merged update is ``lora_delta`` of each adapted Linear: every client receives it with its
blocks and adds it to its frozen weight (the official code sends the stacked factors and merges
on the client; a node here keeps nothing between rounds, so it gets the merged sum of all
rounds: bytes-down grow with d_out x d_in, not with the number of clients).

Scaling as in the official code: a rank-r_i client has alpha = 2 r_i, the server's stacked LoRA
alpha/r of the run, both the same factor s, here s = lora-alpha / lora-r for every client and
for the merge (set lora-alpha = 2 lora-r for the code's 2). The fresh A of round t is drawn from
the run's seed and t (numpy), the same on every run with that seed. p_i is over the clients that
held the block (with FedRA's allocation, depth x rank). The head is averaged (|D_i| weights).
"""

from __future__ import annotations

import numpy as np

from fedtune_app.methods.lora_ranks import (
    DELTA,
    A,
    B,
    RankRecipe,
    RankStrategy,
    check_exact,
    check_rank_method,
    holder_weights,
    kaiming_a,
    lora_modules,
    mean_product,
)
from fedtune_app.methods.registry import register_method


class FLoRA(RankStrategy):
    name = "flora"
    private_aggregation = False  # the stack holds every client's factors
    sends_delta = True

    def aggregate(self, updates):
        new = self.plain_mean(updates)  # the head
        rng = np.random.default_rng([self.cfg.seed, 3, self.history[-1].round])
        for module in lora_modules(self.state):
            stacked = mean_product(updates, module)  # = B_stack A_stack, the stack's product
            if stacked is not None:
                merged = self.state[module + DELTA] + self.scale * stacked
                new[module + DELTA] = merged.astype(np.float32)
            # step 1 of the next round: fresh adapters
            new[module + A] = kaiming_a(self.state[module + A].shape, rng)
            new[module + B] = np.zeros_like(self.state[module + B])
        return self.server_objective(updates, new)


def stack(updates, module: str) -> tuple[np.ndarray, np.ndarray]:
    """Step 3 written out: (B_stack, A_stack) over the module's holders (tests check that its
    product is ``mean_product``)."""
    held = holder_weights(updates, module)
    return (np.concatenate([u.tensors[module + B] for u, _ in held], axis=1),
            np.concatenate([p * u.tensors[module + A] for u, p in held], axis=0))


class FLoRARecipe(RankRecipe):
    receives_delta = has_delta = True


def check(cfg):
    check_rank_method(cfg)
    check_exact(cfg)


register_method("flora", strategy=FLoRA, recipe=FLoRARecipe, check=check)
