"""AllLarge and AllSmall, the bounds FedRA is compared with (FedRA Sec. 4.1).

AllLarge: every client trains the whole L-block model (as if no client were constrained): the
ceiling. AllSmall: every client trains only the smallest client's model, the first min_i L_i
blocks of the static profile 'capacities' ("all clients use the same number of layers as the
smallest model"), and that small model is the global model that is evaluated. Under dynamic
capacities AllSmall ignores the rounds' draws: FedRA's Table 4 (dynamic, capacities 12*6)
repeats Table 1's AllSmall row digit for digit, i.e. the 3-layer model of the profile
12,10,8,6,4,3, so ``all-small-layers`` names that depth (the Table 4 presets set 3).

Over model groups (HeteroTune Sec. 4.1): AllSmall puts every client in the smallest group's
model (group 0), AllLarge in the largest group's (the last), the ceiling no real federation of
weak devices could reach; each client then trains its whole model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedtune_app.config import ConfigError, ConfigPart, RunConfig, config_key
from fedtune_app.federated.allocation import full_plans, smallest_prefix_plans
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method


class AllLarge(LayerPlanStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "all-large"

    def plan_round(self, server_round, clients):
        return full_plans([c.capacity for c in clients], self.num_layers)


class AllSmall(LayerPlanStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "all-small"

    @property
    def smallest(self) -> int:
        """``all-small-layers``, else min_i L_i of the static capacities (``self.clients``)."""
        return self.cfg.own.all_small_layers or min(c.capacity for c in self.clients)

    def plan_round(self, server_round, clients):
        return smallest_prefix_plans([c.capacity for c in clients], self.num_layers,
                                     smallest=self.smallest)

    def eval_plan(self):
        return tuple(range(self.smallest))


class GroupAllSmall(GroupStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "all-small"


class GroupAllLarge(GroupStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "all-large"


@dataclass(frozen=True)
class AllSmallConfig(ConfigPart):
    """AllSmall's own key."""
    all_small_layers: int = config_key(0, minimum=0, help=
        "AllSmall: blocks of the model every client trains (0 = the smallest static capacity in "
        "'capacities', also under dynamic capacities, whose draws AllSmall ignores; FedRA Table "
        "4's AllSmall row is Table 1's 3-layer model, so its presets set 3)")


register_method("all-large", strategy=AllLarge, group_strategy=GroupAllLarge, fixed_group=-1,
                ceiling=True)
def check_all_small(cfg: RunConfig) -> None:
    layers, capacities = cfg.own.all_small_layers, cfg.federation.capacity_list
    if layers > min(capacities):
        raise ConfigError(f"run-config key 'all-small-layers' = {layers} is deeper than the "
                          f"smallest client of key 'capacities' ({cfg.federation.capacities}): "
                          "AllSmall "
                          f"trains a model every client holds; allowed: 0 to {min(capacities)}")


register_method("all-small", strategy=AllSmall, group_strategy=GroupAllSmall, fixed_group=0,
                check=check_all_small, config=AllSmallConfig)
