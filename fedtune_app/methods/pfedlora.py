"""pFedLoRA: model-heterogeneous federated learning with a homogeneous small adapter (Yi et al.,
arXiv 2310.13283), as HeteroTune compares with it: "LoRA decomposition to obtain homomorphic
low-rank matrices, facilitating heterogeneous model aggregation", aggregated by "simple
averaging of low-rank matrices" (HeteroTune Sec. 2 and 4.1).

Adapter: on every adapted Linear W (d_in -> d_out; by default the last FC of both sublayers)
of a group-g model,  y = W x + (alpha / r) B_g C A_g dropout(x),  with A_g: r x d_in and
B_g: d_out x r the model's own low-rank factors (they depend on its width) and C: r x r the
HOMOGENEOUS small adapter: the same shape in every model, whatever its width or depth. Block
j of a model with L_g blocks holds the adapter of relative depth position k = floor(j K / L_g),
K = the smallest model's depth, so models of different depths share K positions.

Algorithm, per round:
  1. a client of group g gets its model's tensors (A_g, B_g, head, and the C of its blocks);
  2. iterative training (pFedLoRA Sec. 4.2): first the received homogeneous adapters C stay
     frozen while the local model's part (A_g, B_g, head) trains on local data (it absorbs the
     global knowledge), then the local part stays frozen while C trains (it takes up the local
     knowledge): ``pfedlora-model-epochs`` then ``pfedlora-adapter-epochs`` epochs (0 =
     ``local-epochs`` each). pFedLoRA's own numbers for the two phases could not be read here
     (no copy of its experimental section offline): set them to its paper's before citing a
     pFedLoRA row. ``pfedlora-passes``: by default (``per-phase``) each phase passes over all
     the client's data, two passes a round where HeteroTune makes one (its clients train
     ``local-epochs`` over their data, HeteroTune Sec. 4.1); ``shared`` gives HeteroTune's
     budget: the client's examples are cut in two seeded halves, phase 1 trains on one and
     phase 2 on the other, so both phases together pass over the data once per epoch;
  3. server: every homogeneous adapter of position k (any group, any block mapped to k) is
     averaged over all clients that sent it (example-weighted) -- the global adapter; A_g, B_g
     and the head are averaged within group g only.

Choices made here (pFedLoRA trains personalised CNNs and uploads only the adapter): to have one
global model per group, as HeteroTune's tables evaluate, A_g, B_g and the head travel too and are
averaged within the group, so bytes per round are those of the group's tensors (reported);
C starts as the identity (so B C A = B A, LoRA's start: B = 0, the pretrained model);
the frozen backbone is the pretrained one (pFedLoRA trains its local models whole).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from torch import nn

from fedtune_app.config import ConfigPart, config_key
from fedtune_app.methods.flexifed import split_name
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method
from fedtune_app.model.adapters import block_of, resolve_modules, trainable_parameters
from fedtune_app.model.backbones import build_backbone
from fedtune_app.training.local import train_local
from fedtune_app.training.recipes import ClientRecipe

CORE = "lora_C"


class CoreLoRA(nn.Module):
    """A Linear with the low-rank update B C A (A: ``lora_A``, C: ``lora_C``, B: ``lora_B``)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_C = nn.Linear(r, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.scale * self.lora_B(self.lora_C(self.lora_A(self.dropout(x))))


def core_position(block: int, depth: int, positions: int) -> int:
    """Relative depth: block j of an L-block model -> position floor(j K / L) of K."""
    return block * positions // depth


def pfedlora_keys(state: dict[str, np.ndarray], depths: list[int]) -> dict[str, str]:
    """Aggregation keys: a homogeneous adapter's key is its position and block-relative name
    (shared by every group), any other tensor's key is its own name (its group's mean)."""
    positions = min(depths)
    keys = {}
    for name in state:
        g, rest = split_name(name)
        j = block_of(rest)
        if g is not None and j is not None and f".{CORE}." in rest:
            k = core_position(j, depths[g], positions)
            keys[name] = f"core.{k}.{rest.split('.', 2)[2]}"
        else:
            keys[name] = name
    return keys


def identity_cores(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The initial state with every homogeneous adapter C = I."""
    return {n: np.eye(v.shape[0], dtype=v.dtype) if f".{CORE}." in n else v
            for n, v in state.items()}


def attach_core_lora(model, modules: list[str], r: int, alpha: float, dropout: float):
    """Replace each block's adapted Linear layers by ``CoreLoRA`` (in place)."""
    for block in model.blocks:
        for name in modules:
            parent_name, _, leaf = name.rpartition(".")
            parent = block.get_submodule(parent_name) if parent_name else block
            setattr(parent, leaf, CoreLoRA(getattr(parent, leaf), r, alpha, dropout))
    return model


class PFedLoRARecipe(ClientRecipe):
    """The B C A adapter instead of peft's LoRA, C = I at start, iterative local training."""

    gradient_bounds: dict[str, float] = {}  # two training phases a round

    def build(self, spec, backbone=build_backbone):
        model = backbone(spec)
        modules = resolve_modules(model, self.cfg.adapter.adapter_modules)
        attach_core_lora(model, modules, self.cfg.adapter.lora_r, self.cfg.adapter.lora_alpha,
                         self.cfg.adapter.lora_dropout)
        model.requires_grad_(False)
        for param in trainable_parameters(model).values():
            param.requires_grad_(True)
        return self.extend(model)

    def initial_state(self, model, seed):
        return identity_cores(super().initial_state(model, seed))

    @staticmethod
    def library_state(state):
        """B C A is LoRA's B' A with B' = B C: each core is folded into its B (the product in
        float64, rounded once to float32), so that peft's LoRA computes the run's model."""
        folded = {n: v for n, v in state.items() if f".{CORE}." not in n}
        for name, core in state.items():
            if f".{CORE}." in name:
                b = name.replace(f".{CORE}.", ".lora_B.")
                folded[b] = (state[b].astype(np.float64) @ core.astype(np.float64)).astype(
                    np.float32)
        return folded

    def fit(self, model, plan, params, examples, seed, device, loss_fn, server_round) -> float:
        """Step 2: the local part with C frozen, then C with the local part frozen."""
        subnet = model.subnetwork(plan)
        local = {n: p for n, p in params.items() if f".{CORE}." not in n}
        cores = {n: p for n, p in params.items() if f".{CORE}." in n}
        loss = 0.0
        own, training = self.cfg.own, self.cfg.training
        epochs = [own.pfedlora_model_epochs or training.local_epochs,
                  own.pfedlora_adapter_epochs or training.local_epochs]
        data = phase_data(examples, own.pfedlora_passes, seed)
        for phase, (train, frozen) in enumerate(((local, cores), (cores, local))):
            for p in frozen.values():
                p.requires_grad_(False)
            loss = train_local(subnet, list(train.values()), data[phase],
                               dataclasses.replace(training, local_epochs=epochs[phase]),
                               seed=seed + phase, device=device, loss_fn=loss_fn)
            for p in frozen.values():
                p.requires_grad_(True)
        return loss  # of the last phase


def phase_data(examples, passes: str, seed: int) -> tuple:
    """The examples of phase 1 and phase 2: all of them each (``per-phase``), or two halves of
    a seeded permutation (``shared``; a one-example client trains on it in both phases)."""
    if passes == "per-phase" or len(examples) < 2:
        return examples, examples
    order = np.random.default_rng(seed).permutation(len(examples))
    cut = len(examples) // 2
    return examples.subset(np.sort(order[:cut])), examples.subset(np.sort(order[cut:]))


class PFedLoRA(GroupStrategy):
    name = "pfedlora"

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.keys = pfedlora_keys(self.state, self.depths)

    def aggregate(self, updates):
        return self.server_objective(updates, self.combine(updates, self.keys))


@dataclass(frozen=True)
class PFedLoRAConfig(ConfigPart):
    """pFedLoRA's own keys."""
    pfedlora_model_epochs: int = config_key(0, minimum=0, help=
        "pFedLoRA iterative training, phase 1: epochs of the local model's part with the "
        "homogeneous adapter frozen (0 = 'local-epochs')")
    pfedlora_adapter_epochs: int = config_key(0, minimum=0, help=
        "pFedLoRA iterative training, phase 2: epochs of the homogeneous adapter with the local "
        "part frozen (0 = 'local-epochs')")
    pfedlora_passes: str = config_key("per-phase", choices=("per-phase", "shared"), help=
        "pFedLoRA: 'per-phase', each phase over all the client's data (its iterative training, "
        "Sec. 4.2: the local model, then the adapter; two passes a round where HeteroTune makes "
        "one), or 'shared': the phases take two seeded halves of the data, one pass a round in "
        "all, HeteroTune's local budget")



register_method("pfedlora", group_strategy=PFedLoRA, recipe=PFedLoRARecipe, config=PFedLoRAConfig)
