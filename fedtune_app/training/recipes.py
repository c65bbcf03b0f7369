"""Client recipes: the client-side part of a method (DESIGN.md section 2, "client recipe").

A recipe says which extra trainable modules the model carries (``extend``), which tensors a plan
trains (``trainables``), the local loss (``loss``) and training (``fit``, e.g. FedBRICK's two
stages), the round's config (``configure``), what runs before local training (``begin``,
e.g. FedBRICK's stage choice), and how the server's global model predicts
(``eval_logits``). The default recipe is plain task loss on the sub-network (FedRA, AllLarge,
AllSmall, InclusiveFL). A method with its own recipe names it when it registers
(``methods.registry.register_method``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from fedtune_app.config import RunConfig
from fedtune_app.data.splits import batches_per_pass
from fedtune_app.federated.robust import norm, sgd_reach
from fedtune_app.model.adapters import (
    AdapterSpec,
    attach_adapters,
    global_name,
    initial_state,
    load_state,
    trainable_parameters,
)
from fedtune_app.model.backbones import LayeredModel, ModelSpec, build_backbone
from fedtune_app.training.local import round_lr, train_local


class ClientRecipe:
    # for exports: the formula of each kind of tensor the recipe adds (a part of its name ->
    # formula), and the name parts of those that change what the global model predicts
    tensor_formulas: dict[str, str] = {}
    predicting_tensors: tuple[str, ...] = ()
    # model tensor -> a bound on the norm of the local loss's gradient on it at every step,
    # whatever the data: the head's bias under cross-entropy gets the batch mean of
    # softmax(z) - onehot(y), whose norm is at most sqrt(2). A recipe with its own ``loss`` or
    # ``fit`` states its own (none: {}); screening judges these tensors by ``update_bounds``.
    gradient_bounds: dict[str, float] = {"head.bias": math.sqrt(2)}

    @staticmethod
    def library_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """For exports: the global state with the recipe's tensors rewritten into ones a library
        module computes the same way (pFedLoRA's core folded into LoRA's B); default: as is."""
        return state

    def __init__(self, cfg: RunConfig, group: int | None = None):
        self.cfg = cfg
        self.group = group  # model group of the node (None: a single-model run)

    def wire(self, name: str) -> str:
        """Model parameter name -> global state name (group-specific tensors get the group's
        ``groups.<g>.`` prefix)."""
        return name if self.group is None else f"groups.{self.group}.{name}"

    def build(self, spec: ModelSpec, backbone=build_backbone) -> LayeredModel:
        """The node's model: backbone, adapters, the method's extra modules. ``backbone``
        builds the frozen backbone (a client's: one that holds only its plan's blocks)."""
        adapters = AdapterSpec.from_config(self.cfg.adapter)
        return self.extend(attach_adapters(backbone(spec), adapters))

    def initial_state(self, model: LayeredModel, seed: int) -> dict[str, np.ndarray]:
        return {self.wire(n): v for n, v in initial_state(model, seed).items()}

    def load(self, model: LayeredModel, state: dict[str, np.ndarray]) -> None:
        """Load this model's tensors of the global state (the server's evaluation)."""
        wired = {self.wire(n): n for n in trainable_parameters(model)}
        load_state(model, {wired[n]: v for n, v in state.items() if n in wired})

    def cache_key(self) -> tuple:
        """What ``extend`` depends on: a node caches one extended model per key."""
        return ()

    def extend(self, model: LayeredModel) -> LayeredModel:
        """Add the method's extra trainable modules to a freshly built model (once per process)."""
        return model

    def trainables(self, model: LayeredModel, plan) -> dict[str, nn.Parameter]:
        """Global wire name -> parameter, for the tensors a client with ``plan`` trains."""
        subnet = model.subnetwork(plan)
        return {self.wire(global_name(n, plan)): p
                for n, p in trainable_parameters(subnet).items()}

    def received(self, model: LayeredModel, plan) -> dict[str, nn.Parameter]:
        """Global name -> parameter, for every tensor the server sends (trained or not)."""
        return self.trainables(model, plan)

    def assign(self, model: LayeredModel, plan, received: dict[str, np.ndarray]) -> None:
        """Copy what the server sent into the model (every tensor of ``received``); a method
        whose clients hold tensors of another shape (LoRA ranks) or keep some of their own
        overrides it."""
        loaded = self.received(model, plan)
        if set(received) != set(loaded):
            raise ValueError(f"server sent {len(received)} tensors, the plan {plan} has "
                             f"{len(loaded)} tensors to load: "
                             f"{sorted(set(received) ^ set(loaded))[:3]}")
        with torch.no_grad():
            for name, value in received.items():
                loaded[name].copy_(torch.as_tensor(value))

    def trained(self, params: dict[str, nn.Parameter]) -> dict[str, np.ndarray]:
        """The trained tensors as the client sends them back (after ``fit``)."""
        return {n: p.detach().cpu().numpy() for n, p in params.items()}

    def configure(self, config: dict) -> None:
        """This round's train config (``layers``, ``server-round`` and a method's own entries,
        see ``LayerPlanStrategy.train_config``), before ``trainables``."""
        self.round_config = config

    def loss(self, model: LayeredModel, plan, inputs, labels) -> torch.Tensor:
        return nn.functional.cross_entropy(model(inputs, plan), labels)

    def fit(self, model: LayeredModel, plan, params: dict[str, nn.Parameter], examples,
            seed: int, device, loss_fn, server_round: int) -> float:
        """Local training; returns the mean training loss. Default: ``train_local`` of the
        plan's sub-network on ``params`` (FedMD digests first, pFedLoRA trains in two phases)."""
        return train_local(model.subnetwork(plan), list(params.values()), examples,
                           self.cfg.training, seed=seed, device=device, loss_fn=loss_fn)

    def update_bounds(self, sent: dict[str, np.ndarray], num_examples: int, server_round: int,
                      max_batches: int = 0) -> dict[str, float]:
        """Global name -> the farthest (L2) a client training ``num_examples`` examples in round
        ``server_round`` can move that tensor from its ``sent`` value (``robust.sgd_reach``):
        the tensors of ``gradient_bounds`` under SGD with the plain or FedProx objective (FedDyn's
        linear term is the client's own state: unbounded here)."""
        training = self.cfg.training
        kind, coef = self.cfg.objective
        if training.optimizer != "sgd" or kind == "feddyn":
            return {}
        steps = training.local_epochs * batches_per_pass(num_examples, training.batch_size,
                                                         max_batches)
        lr = round_lr(self.cfg, server_round)
        bounds = {}
        for name, grad_bound in self.gradient_bounds.items():
            if (wired := self.wire(name)) in sent:
                if training.grad_clip > 0:  # clipping only ever shortens the gradient
                    grad_bound = min(grad_bound, training.grad_clip)
                bounds[wired] = sgd_reach(steps, lr, training.momentum, grad_bound,
                                          training.weight_decay, norm(sent[wired]),
                                          coef if kind == "fedprox" else 0.0)
        return bounds

    def root_update(self, model: LayeredModel, state: dict[str, np.ndarray],
                    server_round: int) -> dict[str, np.ndarray]:
        """FLTrust's server update (``aggregator = fltrust``): the global model, every block, after
        one round of the clients' local training on the server's root set (the proxy split,
        held out of every client's data); name -> trained - ``state``. Same optimiser, epochs
        and loss as a client; its own seed (partition id -1)."""
        from fedtune_app.data.splits import proxy_indices, run_splits

        splits = run_splits(self.cfg)
        root = splits.train.subset(proxy_indices(self.cfg.data.proxy_fraction, splits))
        plan = tuple(range(model.num_blocks))
        self.load(model, state)
        params = self.trainables(model, plan)
        device = next(model.parameters()).device
        seed = self.cfg.seed * 1_000_003 + server_round * 1009 - 1
        self.fit(model, plan, params, root, seed, device,
                 lambda inputs, labels: self.loss(model, plan, inputs, labels), server_round)
        return {n: p.detach().cpu().numpy().astype(np.float64) - state[n]
                for n, p in params.items()}

    def reply(self) -> dict[str, np.ndarray]:
        """Tensors the client sends back besides the trained ones (FedMD: its class scores on
        the public set), after ``fit``."""
        return {}

    def begin(self, params: dict[str, nn.Parameter], context: Context) -> None:
        """Before local training (params hold what the server sent)."""

    def eval_logits(self, model: LayeredModel, plan, inputs) -> dict[str, torch.Tensor]:
        """Global model's outputs at evaluation: the first entry is THE prediction (its
        log-softmax is the predicted log-probability); further entries are reported as
        ``accuracy-<name>``."""
        return {"": model(inputs, plan)}
