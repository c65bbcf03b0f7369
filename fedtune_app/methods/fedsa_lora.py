"""FedSA-LoRA: selective aggregation, A shared and B local (Guo et al., ICLR 2025).

The paper finds that the A matrices learn what all clients share and the B matrices what is
specific to a client's data. Per round:
  1. client i gets the global A (and the head), puts its OWN B beside it (kept on the node
     from its last round; zero the first time), trains A and B on its data;
  2. the server averages A (|D_i| weights), every B stays where it is.

Choice made here: the paper evaluates each client's personalised model; fedtune's headline is
the server's global model on the test set, so a client also uploads its B and the server keeps
their weighted mean as the global model's B. That B is never sent to a client (bytes-up count
it, bytes-down do not). A node keeps its B in its ``context.state`` (in deployment, on the
device), one entry per block it ever trained.
"""

from __future__ import annotations

import torch

from fedtune_app.methods.lora_ranks import (
    B,
    RankRecipe,
    RankStrategy,
    check_rank_method,
    keep_node_factors,
    node_factors,
)
from fedtune_app.methods.registry import register_method

LOCAL_B = "fedsa-lora-local-b"  # where a node keeps its B


class FedSALoRA(RankStrategy):
    name = "fedsa-lora"
    sent_factors = ("A",)
    returned_factors = ("A", "B")


class FedSALoRARecipe(RankRecipe):
    sent_factors = ("A",)

    def begin(self, params, context):
        """Step 1: the node's own B (first r columns) beside the received A."""
        self.context = context
        own = node_factors(context, LOCAL_B)
        with torch.no_grad():
            for name, param in params.items():
                if name.endswith(B) and name in own:
                    param[:, :self.rank].copy_(torch.as_tensor(own[name][:, :self.rank]))

    def trained(self, params):
        out = super().trained(params)
        keep_node_factors(self.context, LOCAL_B, {n: v for n, v in out.items() if n.endswith(B)})
        return out


register_method("fedsa-lora", strategy=FedSALoRA, recipe=FedSALoRARecipe, check=check_rank_method)
