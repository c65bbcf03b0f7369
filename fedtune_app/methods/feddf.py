"""FedDF: ensemble distillation for robust model fusion (Lin et al., NeurIPS'20), Algorithm 1
with heterogeneous models ("FedDF for heterogeneous systems"), over model groups.

Per round t:
  1. every client k of group g gets its group's global tensors and trains on local data (plain
     local training, the default recipe);
  2. server, per group g: x_g = example-weighted mean of the group's client tensors (FedAvg
     within the group: the initialisation of the fusion);
  3. server: the teacher is the ensemble of ALL received client models (every group):
     AVGLOGITS, z(x) = 1/|S| sum_{k in S} f(x; theta_k), on the unlabelled public set;
  4. server, per group g: starting from x_g, distil the ensemble into the group's model on the
     public set, minimising T^2 KL(softmax(z/T) || softmax(f(x; x_g)/T)); the result is the
     group's new global model.

Public set: ``public-fraction`` (default 20%, HeteroTune's setup) of the training data, held
out and excluded from every client's partition; its labels are never used.

Choices made here (FedDF: Adam lr 1e-3, up to 10^4 steps with early stopping on a validation
split of the unlabelled data): ``distill-epochs`` epochs over the public set per round with
the clients' SGD settings at ``distill-lr``, no early stopping; temperature
``distill-temperature`` (default 1); only the trainable tensors (adapters, head) are distilled,
the pretrained backbone stays frozen. The server's distillation runs on the evaluation models
(``attach``), so it costs no second copy of the backbones.
"""

from __future__ import annotations

import numpy as np

from fedtune_app.training.distill import distill, kd_loss, scores_on
from fedtune_app.training.local import pick_device
from fedtune_app.methods.fedmd import public_set
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.config import Key
from fedtune_app.methods.registry import register_method


class FedDF(GroupStrategy):
    name = "feddf"
    private_aggregation = False  # its ensemble runs every client's model in the clear

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.public = public_set(cfg)
        self.device = pick_device(cfg["device"])

    def group_model(self, g: int):
        return self.model.groups[g], self.recipe.recipes[g], tuple(range(self.depths[g]))

    def aggregate(self, updates):
        mean = self.server_objective(updates, self.combine(updates))
        group_of = {str(c.partition_id): c.model_group for c in self.clients}
        logits = []
        for u in sorted(updates, key=lambda u: u.client):  # step 3: every client model
            model, recipe, plan = self.group_model(group_of[u.client])
            recipe.load(model, mean | u.tensors)
            logits.append(scores_on(model, plan, self.public, self.cfg["eval-batch-size"],
                                    self.device))
        teacher = np.mean(logits, axis=0)
        temperature = self.cfg["distill-temperature"]
        new = dict(mean)
        for g in sorted({group_of[u.client] for u in updates}):  # step 4, per group
            model, recipe, plan = self.group_model(g)
            recipe.load(model, mean)
            params = recipe.trainables(model, plan)
            distill(model, plan, list(params.values()), self.public, teacher,
                    lambda z, t: kd_loss(z, t, temperature), self.cfg,
                    seed=self.cfg["seed"] * 7919 + len(self.history) * 31 + g,
                    device=self.device)
            new |= {n: p.detach().cpu().numpy().astype(mean[n].dtype) for n, p in params.items()}
        return new


register_method("feddf", group_strategy=FedDF, holdout="public", keys={
    "distill-temperature": Key(1.0, "FedDF: softmax temperature of the ensemble distillation",
                               minimum=1e-3),
})
