"""Client recipes: the client-side part of a method (DESIGN.md section 2, "client recipe").

A recipe says which extra trainable modules the model carries (``extend``), which tensors a plan
trains (``trainables``), the local loss (``loss``) and training (``fit``, e.g. FedBRICK's two
stages), the round's config (``configure``), what runs before and after local training
(``begin``/``end``, e.g. a node's FedDyn state), and how the server's global model predicts
(``eval_logits``). The default recipe is plain task loss on the sub-network (FedRA, AllLarge,
AllSmall, InclusiveFL). A method with its own recipe registers it in ``methods.RECIPES``.
"""

from __future__ import annotations

import torch
from flwr.app import Context
from torch import nn

from .adapters import global_name, trainable_parameters
from .backbones import LayeredModel
from .training import train_local


class ClientRecipe:
    def __init__(self, cfg: dict):
        self.cfg = cfg

    def cache_key(self) -> tuple:
        """What ``extend`` depends on: a node caches one extended model per key."""
        return ()

    def extend(self, model: LayeredModel) -> LayeredModel:
        """Add the method's extra trainable modules to a freshly built model (once per process)."""
        return model

    def trainables(self, model: LayeredModel, plan) -> dict[str, nn.Parameter]:
        """Global wire name -> parameter, for the tensors a client with ``plan`` trains."""
        subnet = model.subnetwork(plan)
        return {global_name(n, plan): p for n, p in trainable_parameters(subnet).items()}

    def configure(self, config: dict) -> None:
        """This round's train config (``layers``, ``server-round`` and a method's own entries,
        see ``LayerPlanStrategy.train_config``), before ``trainables``."""
        self.round_config = config

    def loss(self, model: LayeredModel, plan, inputs, labels) -> torch.Tensor:
        return nn.functional.cross_entropy(model(inputs, plan), labels)

    def fit(self, model: LayeredModel, plan, params: dict[str, nn.Parameter], examples,
            seed: int, device) -> float:
        """Local training (one run of ``train_local`` with ``loss``); a method with several
        stages runs its own. Returns the mean training loss."""
        return train_local(model.subnetwork(plan), list(params.values()), examples, self.cfg,
                           seed=seed, device=device,
                           loss_fn=lambda inputs, labels: self.loss(model, plan, inputs, labels))

    def begin(self, params: dict[str, nn.Parameter], context: Context) -> None:
        """Before local training (params hold what the server sent)."""

    def end(self, params: dict[str, nn.Parameter], context: Context) -> None:
        """After local training (params hold the trained values)."""

    def eval_logits(self, model: LayeredModel, plan, inputs) -> dict[str, torch.Tensor]:
        """Global model's outputs at evaluation: the first entry is THE prediction (its
        log-softmax is the predicted log-probability); further entries are reported as
        ``accuracy-<name>``."""
        return {"": model(inputs, plan)}
