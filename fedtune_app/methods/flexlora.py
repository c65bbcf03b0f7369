"""FlexLoRA: heterogeneous ranks through the full-size update and its SVD (Bai et al., NeurIPS
2024).

Per round:
  1. client i gets the global LoRA truncated to its rank r_i (its top-r_i SVD factors, see 3),
     trains them on its data and returns B_i (d_out x r_i) and A_i (r_i x d_in);
  2. the server forms each client's full-size update B_i A_i and their weighted mean
         W = sum_i p_i B_i A_i,   p_i = |D_i| / sum_j |D_j|  (over the clients holding the block);
  3. SVD W = U S V^T; the global factors are B = U_R S_R, A = V_R^T (R = lora-r, the largest
     rank), so the first r_i components a client of rank r_i receives are exactly the best
     rank-r_i approximation of W (Eckart-Young).
The global model is W itself: what lies beyond rank R (W - B A, which a sum of clients' ranks
can exceed R) is kept in ``lora_delta`` for the server's evaluation and the export, and never
sent (a client trains on W0 + B_i A_i, as in the paper).

Choice the paper leaves open here: where S goes in the split ('flexlora-split': all of it on B,
or sqrt(S) on each factor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedtune_app.config import ConfigPart, config_key
from fedtune_app.methods.lora_ranks import (
    DELTA,
    A,
    B,
    RankRecipe,
    RankStrategy,
    check_exact,
    check_rank_method,
    lora_modules,
    mean_product,
)
from fedtune_app.methods.registry import register_method


def top_factors(w: np.ndarray, rank: int, split: str = "sigma-in-b") -> tuple[np.ndarray, ...]:
    """(B, A) of the best rank-``rank`` approximation B A of ``w`` (step 3)."""
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    u, s, vt = u[:, :rank], s[:rank], vt[:rank]
    if len(s) < rank:  # a matrix thinner than the rank: the extra components are zero
        u = np.pad(u, ((0, 0), (0, rank - len(s))))
        vt = np.pad(vt, ((0, rank - len(s)), (0, 0)))
        s = np.pad(s, (0, rank - len(s)))
    if split == "sqrt":
        root = np.sqrt(s)
        return u * root, root[:, None] * vt
    return u * s, vt


class FlexLoRA(RankStrategy):
    name = "flexlora"
    private_aggregation = False  # the server multiplies every client's factors

    def aggregate(self, updates):
        new = self.plain_mean(updates)  # the head
        for module in lora_modules(self.state):
            w = mean_product(updates, module)
            if w is None:  # nobody held the block: it keeps its factors and its delta
                continue
            b, a = top_factors(w, self.top, self.cfg.own.flexlora_split)
            new[module + B], new[module + A] = b.astype(np.float32), a.astype(np.float32)
            new[module + DELTA] = (self.scale * (w - b @ a)).astype(np.float32)
        return self.server_objective(updates, new)


class FlexLoRARecipe(RankRecipe):
    has_delta = True  # the server's model: W beyond rank R (clients keep it zero)


@dataclass(frozen=True)
class FlexLoRAConfig(ConfigPart):
    """FlexLoRA's own key."""
    flexlora_split: str = config_key("sigma-in-b", choices=("sigma-in-b", "sqrt"), help=
        "FlexLoRA: how the singular values S of the mean update U S V^T are split between the "
        "factors: B = U S, A = V^T (sigma-in-b) or B = U sqrt(S), A = sqrt(S) V^T (sqrt)")


def check(cfg):
    check_rank_method(cfg)
    check_exact(cfg)


register_method("flexlora", strategy=FlexLoRA, recipe=FlexLoRARecipe, check=check,
                config=FlexLoRAConfig)
