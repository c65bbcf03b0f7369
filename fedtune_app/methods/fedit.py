"""FedIT: federated instruction tuning with LoRA (Zhang et al., ICASSP 2024), the reference the
exact-aggregation methods improve on.

Per round: every client trains LoRA (A, B) and the head on its data; the server takes FedAvg of
A and of B separately, weights |D_i|:
    A = sum_i p_i A_i,   B = sum_i p_i B_i,   p_i = |D_i| / sum_j |D_j|.
The model the server then holds, W0 + s B A, is NOT the mean of the clients' models
W0 + s B_i A_i: B A - sum_i p_i B_i A_i = -(1/2) sum_{i,j} p_i p_j (B_i - B_j)(A_i - A_j), the
residual FedEx-LoRA folds back and FLoRA avoids by stacking.

Clients of different ranks (key 'ranks'): each component of A and B is averaged over the clients
that hold it (``lora_ranks.component_mean``), the zero-padding the FLoRA paper compares with,
without counting the padded zeros. Any aggregator ('aggregator') applies per component.
"""

from __future__ import annotations

from fedtune_app.methods.lora_ranks import RankRecipe, RankStrategy, check_rank_method
from fedtune_app.methods.registry import register_method


class FedIT(RankStrategy):
    name = "fedit"


register_method("fedit", strategy=FedIT, recipe=RankRecipe, check=check_rank_method)
