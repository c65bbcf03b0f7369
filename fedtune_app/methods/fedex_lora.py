"""FedEx-LoRA: exact aggregation by folding the residual into the frozen weight (Singhal et
al., 2024).

Per round, as FedIT: clients train A and B, the server averages them (A = sum_i p_i A_i,
B = sum_i p_i B_i, p_i = |D_i| / sum_j |D_j| over the clients that held the block). FedIT's
model W0 + s B A misses the mean of the clients' models by the residual
    R = sum_i p_i B_i A_i - B A,
so FedEx-LoRA adds s R to the frozen weight of every adapted Linear, after which
W0' + s B A = W0 + s sum_i p_i B_i A_i exactly. The residuals accumulate over the rounds in
``lora_delta``, which every client receives with its blocks and adds to its frozen weight
(frozen weights never travel: the delta does, counted in bytes-down).

With clients of different ranks the factors are averaged per component
(``lora_ranks.component_mean``); the fold makes the model exact whatever the factors' mean.
"""

from __future__ import annotations

from fedtune_app.methods.lora_ranks import (
    DELTA,
    RankRecipe,
    RankStrategy,
    check_exact,
    check_rank_method,
    lora_modules,
    mean_product,
    product,
)
from fedtune_app.methods.registry import register_method


class FedExLoRA(RankStrategy):
    name = "fedex-lora"
    private_aggregation = False  # the residual reads every client's product B_i A_i
    sends_delta = True

    def aggregate(self, updates):
        new = self.component_mean(updates)
        for module in lora_modules(self.state):
            exact = mean_product(updates, module)
            if exact is None:  # nobody held the block: nothing moved
                continue
            residual = self.scale * (exact - product(new, module))
            new[module + DELTA] = (self.state[module + DELTA] + residual).astype("float32")
        return self.server_objective(updates, new)


class FedExLoRARecipe(RankRecipe):
    receives_delta = has_delta = True


def check(cfg):
    check_rank_method(cfg)
    check_exact(cfg)


register_method("fedex-lora", strategy=FedExLoRA, recipe=FedExLoRARecipe, check=check)
