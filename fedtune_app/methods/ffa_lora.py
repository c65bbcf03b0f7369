"""FFA-LoRA: federated freeze-A LoRA (Sun et al., ICLR 2024).

A stays at its random initialisation on every client, only B (and the head) trains and
travels; the server averages B (|D_i| weights). With A the same everywhere the aggregate is
exact: sum_i p_i B_i A = (sum_i p_i B_i) A, and each round's upload is half of LoRA's.

A is the run's seeded initial A (``adapters.initial_state``: the same draw on every node from
the run's seed), so it never travels either: a node draws it itself. Clients of different ranks
hold its first r rows. The paper's point that the scaling alpha matters more once A is frozen
is left to 'lora-alpha' (its experiments raise it; fedtune keeps the run's value).
"""

from __future__ import annotations

from fedtune_app.methods.lora_ranks import (
    RankRecipe,
    RankStrategy,
    check_rank_method,
    seeded_factor,
)
from fedtune_app.methods.registry import register_method


class FFALoRA(RankStrategy):
    name = "ffa-lora"
    sent_factors = ("B",)
    returned_factors = ("B",)


class FFALoRARecipe(RankRecipe):
    sent_factors = ("B",)
    trained_factors = ("B",)

    def extend(self, model):
        model = super().extend(model)
        for name, param in model.named_parameters():
            if ".lora_A." in name:
                param.requires_grad_(False)  # frozen: no gradient is ever computed for it
        return model

    def own_factor(self, model, name):
        return seeded_factor(model, self.cfg, name) if name.endswith(".lora_A.weight") else None


register_method("ffa-lora", strategy=FFALoRA, recipe=FFALoRARecipe, check=check_rank_method)
