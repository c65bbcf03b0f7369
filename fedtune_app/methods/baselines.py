"""AllLarge and AllSmall, the bounds FedRA is compared with (FedRA Sec. 4.1).

AllLarge: every client trains the whole L-block model (as if no client were constrained): the
ceiling. AllSmall: every client trains only the smallest client's model, the first min_i L_i
blocks, and that small model is the global model that is evaluated.

Over model groups (HeteroTune Sec. 4.1): AllSmall puts every client in the smallest group's
model (group 0), AllLarge in the largest group's (the last), the ceiling no real federation of
weak devices could reach; each client then trains its whole model.
"""

from __future__ import annotations

from fedtune_app.federated.allocation import full_plans, smallest_prefix_plans
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method


class AllLarge(LayerPlanStrategy):
    name = "all-large"

    def plan_round(self, server_round, clients):
        return full_plans([c.capacity for c in clients], self.num_layers)


class AllSmall(LayerPlanStrategy):
    name = "all-small"

    @property
    def smallest(self) -> int:
        # under dynamic capacities a client may hold a single block in any round
        return 1 if self.cfg["dynamic-capacities"] else min(c.capacity for c in self.clients)

    def plan_round(self, server_round, clients):
        return smallest_prefix_plans([c.capacity for c in clients], self.num_layers,
                                     smallest=self.smallest)

    def eval_plan(self):
        return tuple(range(self.smallest))


class GroupAllSmall(GroupStrategy):
    name = "all-small"


class GroupAllLarge(GroupStrategy):
    name = "all-large"


register_method("all-large", strategy=AllLarge, group_strategy=GroupAllLarge, fixed_group=-1)
register_method("all-small", strategy=AllSmall, group_strategy=GroupAllSmall, fixed_group=0)
