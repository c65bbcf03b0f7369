"""Baselines over model groups (HeteroTune Sec. 4.1, Tables 1, 3, 5).

Every client trains its whole model's adapters and head; tensors are named per group
(``groups.<g>.blocks.3.mlp.fc2.lora_A.weight``), so the masked example-weighted mean is a FedAvg
within each group and nothing crosses groups.

  * Homo-training (``homo``): each group of clients trains its own model alone (its own FedAvg);
    each group's global model is evaluated.
  * AllSmall / AllLarge over model groups: see ``baselines``.

The node side puts a client in its group (``groups.node_model_group``); here the server only
sends each client the tensors of its own group.
"""

from __future__ import annotations

from fedtune_app.data.groups import group_depths, node_model_group, prefix
from fedtune_app.federated.strategy import LayerPlanStrategy
from fedtune_app.methods.registry import register_method


class GroupStrategy(LayerPlanStrategy):
    """Base of the methods over model groups: each client holds its group's whole model."""

    name = "model-groups"

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.depths = group_depths(cfg)

    @classmethod
    def check_fleet(cls, cfg, capacities, num_layers):
        """A capacity picks the client's model group, held whole: each must fit one."""
        for partition_id, capacity in enumerate(capacities):
            node_model_group(cfg, partition_id, len(capacities), capacity)

    def plan_round(self, server_round, clients):
        return [tuple(range(self.depths[c.model_group])) for c in clients]

    def client_payload(self, client, plan):
        own = prefix(client.model_group)
        return [n for n in self.state if n.startswith(own)]


class Homo(GroupStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "homo"



register_method("homo", group_strategy=Homo)
