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

Step 4 as FedDF runs it, the default (``feddf-distillation = paper``; its paper and public
code: Adam at lr 1e-3 with cosine annealing, up to 10^4 distillation steps, validation every 100
steps and early stopping after 10^3 steps without a better validation accuracy, keeping the best
model): ``feddf-lr``, ``feddf-steps``, ``feddf-eval-every``, ``feddf-patience``. The validation
data is ``feddf-val-fraction`` (default 10%) of the public set, held out of the distillation,
whose labels it uses for early stopping only. FedDF early-stops on a validation set; how large
its split was could not be read here and HeteroTune describes none, so the 10% is ours; 0 = no
split, every round then runs all ``feddf-steps``. ``feddf-distillation = epochs`` is the cheaper
stand-in: ``distill-epochs`` epochs over the whole public set (no validation split) with the
clients' optimizer at ``distill-lr``.

Choices made here: temperature ``distill-temperature`` (default 1); only the trainable
tensors (adapters, head) are distilled, the pretrained backbone stays frozen. The server's
distillation runs on the evaluation models (``attach``), so it costs no second copy of the
backbones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedtune_app.config import config_key
from fedtune_app.data.splits import SPLIT_SEED, Examples
from fedtune_app.methods.fedmd import DistillConfig, public_set
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method
from fedtune_app.training.distill import distill, distill_steps, kd_loss, scores_on
from fedtune_app.training.local import pick_device


class FedDF(GroupStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "feddf"
    private_aggregation = False  # its ensemble runs every client's model in the clear

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        # the epochs stand-in validates nothing: it distils on the whole public set
        fraction = cfg.own.feddf_val_fraction if cfg.own.feddf_distillation == "paper" else 0.0
        self.public, self.validation = split_validation(public_set(cfg), fraction)
        self.device = pick_device(cfg.training.device)

    def fuse(self, model, plan, params, teacher, seed: int, group: int) -> None:
        """Step 4 for one group: distil ``teacher`` into ``params``."""
        temperature = self.cfg.own.distill_temperature

        def loss(z, t):
            return kd_loss(z, t, temperature)

        if self.cfg.own.feddf_distillation == "epochs":
            own = self.cfg.own
            distill(model, plan, params, self.public, teacher, loss, self.cfg.training,
                    own.distill_epochs, own.distill_lr, seed=seed, device=self.device)
            return

        def validate():
            scores = scores_on(model, plan, self.validation, self.cfg.federation.eval_batch_size,
                               self.device)
            return float((scores.argmax(-1) == self.validation.labels.numpy()).mean())

        steps = distill_steps(model, plan, params, self.public, teacher, loss,
                              self.cfg.own.feddf_steps, self.cfg.own.feddf_lr,
                              self.cfg.training.batch_size, seed, self.device,
                              validate=validate if self.validation is not None else None,
                              eval_every=self.cfg.own.feddf_eval_every,
                              patience=self.cfg.own.feddf_patience,
                              what=f"feddf round {self.history[-1].round} group {group}: server "
                                   "distillation")
        self.history[-1].method_metrics.setdefault("feddf-steps", []).append(steps)

    def group_model(self, g: int):
        return self.model.groups[g], self.recipe.recipes[g], tuple(range(self.depths[g]))

    def aggregate(self, updates):
        mean = self.server_objective(updates, self.combine(updates))
        group_of = {str(c.partition_id): c.model_group for c in self.clients}
        logits = []
        for u in sorted(updates, key=lambda u: u.client):  # step 3: every client model
            model, recipe, plan = self.group_model(group_of[u.client])
            recipe.load(model, mean | u.tensors)
            logits.append(scores_on(model, plan, self.public, self.cfg.federation.eval_batch_size,
                                    self.device))
        teacher = np.mean(logits, axis=0)
        new = dict(mean)
        for g in sorted({group_of[u.client] for u in updates}):  # step 4, per group
            model, recipe, plan = self.group_model(g)
            recipe.load(model, mean)
            params = recipe.trainables(model, plan)
            self.fuse(model, plan, list(params.values()), teacher,
                      seed=self.cfg.seed * 7919 + len(self.history) * 31 + g, group=g)
            new |= {n: p.detach().cpu().numpy().astype(mean[n].dtype) for n, p in params.items()}
        return new


def split_validation(public: Examples, fraction: float):
    """(distillation set, validation set or None): the first ``fraction`` of a fixed
    permutation of the public set validates (its labels used for early stopping only)."""
    if fraction <= 0:
        return public, None
    order = np.random.default_rng(SPLIT_SEED + 5).permutation(len(public))
    cut = max(1, int(round(fraction * len(public))))
    return public.subset(order[cut:]), public.subset(order[:cut])


@dataclass(frozen=True)
class FedDFConfig(DistillConfig):
    """FedDF's own keys, beside the public set and distillation keys it shares with FedMD."""
    feddf_distillation: str = config_key("paper", choices=('paper', 'epochs'), help=
        "FedDF's server distillation: as its paper (Adam, cosine annealing, up to 'feddf-steps', "
        "early stopping on a validation split when 'feddf-val-fraction' > 0) or 'epochs' "
        "('distill-epochs' at 'distill-lr' with the clients' optimizer)")
    feddf_lr: float = config_key(0.001, minimum=0, help=
        "FedDF: Adam learning rate of the server distillation (paper: 1e-3)")
    feddf_steps: int = config_key(10000, minimum=1, help=
        "FedDF: most distillation steps per round and group (paper: 10^4)")
    feddf_eval_every: int = config_key(100, minimum=1, help=
        "FedDF: validate every this many distillation steps")
    feddf_patience: int = config_key(1000, minimum=1, help=
        "FedDF: stop after this many steps without a better validation accuracy (paper: 10^3)")
    feddf_val_fraction: float = config_key(0.1, minimum=0, maximum=0.5, help=
        "FedDF (feddf-distillation = paper): share of the public set held out, labelled, to "
        "validate the distillation for early stopping (FedDF early-stops on a validation set; "
        "its size could not be read, 10% is ours; 0 = no split: all feddf-steps every round)")
    distill_temperature: float = config_key(1.0, minimum=0.001, help=
        "FedDF: softmax temperature of the ensemble distillation")


register_method("feddf", group_strategy=FedDF, holdout="public", config=FedDFConfig)
