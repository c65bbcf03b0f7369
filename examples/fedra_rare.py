"""FedRA-Rare: FedRA's random layer allocation, tilted towards the blocks trained least so far.

A method in one file (docs/writing-a-method.md). FedRA gives client i a uniform random
set of L_i of the L blocks every round. Here, per round:
  1. n_j = how many accepted client updates held block j in the rounds so far;
  2. for each sampled client, in partition-id order: draw its L_i blocks without replacement
     with P(j) proportional to (1 + n_j)^-p, then add 1 to n_j of the blocks it got;
  3. aggregate as FedRA (masked, example-weighted mean of the blocks each client held).
p = ``fedra-rare-power``: 0 is FedRA's uniform draw, large p is "least trained first". All
draws come from the strategy's seeded generator and n_j from the round history (restored on
resume): same seed, same allocation.

To run it with ``flwr run``: copy this file into ``fedtune_app/methods/`` (every module there
registers itself), add its key to pyproject.toml with
``python -m fedtune_app.tools.pyproject_keys --write``, then
``flwr run . --run-config 'method="fedra-rare" fedra-rare-power=2.0'``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedtune_app.config import ConfigError, ConfigPart, RunConfig, config_key
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.methods.registry import register_method


def trained_counts(history, num_layers: int) -> np.ndarray:
    """n_j over the rounds in ``history``: rejected replies and rounds without update excluded."""
    counts = np.zeros(num_layers)
    for entry in history:
        for pid, plan in entry.plans.items():
            if entry.state_updated and pid not in entry.rejected:
                counts[list(plan)] += 1
    return counts


def rarity_plans(capacities, counts: np.ndarray, power: float, rng: np.random.Generator):
    counts, plans = counts.copy(), []
    for capacity in capacities:
        weights = ((1 + counts) / (1 + counts.min())) ** -power  # the largest is 1: no underflow
        plan = rng.choice(len(counts), size=capacity, replace=False, p=weights / weights.sum())
        plans.append(tuple(sorted(plan.tolist())))
        counts[plan] += 1
    return plans


class FedRARare(LayerPlanStrategy):
    name = "fedra-rare"

    def plan_round(self, server_round, clients):
        counts = trained_counts(self.history, self.num_layers)
        return rarity_plans([c.capacity for c in clients], counts, self.cfg.own.fedra_rare_power,
                            self.rng)


@dataclass(frozen=True)
class FedRARareConfig(ConfigPart):
    """FedRA-Rare's own key (run-config key ``fedra-rare-power``)."""
    fedra_rare_power: float = config_key(1.0, minimum=0, help=
        "FedRA-Rare: block j is drawn with probability proportional to (1 + times trained)^-power"
        " (0 = FedRA's uniform draw)")


def check(cfg: RunConfig) -> None:
    policy = cfg.federation.missing_layer_policy
    if policy != "keep-previous":
        raise ConfigError(f"run-config key 'missing-layer-policy' = {policy!r}: method "
                          "'fedra-rare' draws by rarity and keeps a block nobody held; allowed: "
                          "keep-previous")


register_method("fedra-rare", strategy=FedRARare, check=check, config=FedRARareConfig)
