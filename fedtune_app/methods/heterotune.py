"""HeteroTune: FedAdapter with multi-branch cross-model aggregation (seed paper, Sec. 3).

Clients fall into M model groups (different backbones: width and/or depth, ``groups.py``).
Every block's adapted Linear (``adapter-modules``, default the last FC of both sublayers,
attention output and MLP) of group g's model (width d_g) carries a FedAdapter on its output y:

  local-adapter (group g's own):  W_d in R^{d_g x r}, W_u in R^{r x d_g}
  share-adapter, one branch per model group i = 1..M:  S_d^i, S_u^i in R^{r x r}
  branch weights (learnable scalars, group g's own):  a_1..a_M
  Eq. 5:  y -> y + h(y W_d sum_i a_i S_d^i) (sum_i a_i S_u^i) W_u ,  h = GELU, r = ``lora-r``
  Eq. 6 (inference):  A' = W_d sum_i a_i S_d^i,  B' = (sum_i a_i S_u^i) W_u,
                      y -> y + h(y A') B'   (the same function; evaluated and saved fused)

Algorithm 1, per round:
  1. client k of group g receives its group's local-adapters, branch weights and head
     (``groups.<g>.*``) and ALL M share-adapter branches (``share.adapter.<p>.<i>.*``);
  2. it trains its local-adapters, branch weights, head and its OWN branch S^g (the other
     M-1 branches are frozen) on CE + lambda/2 * sum ||S^g - S^g_received||^2, and sends back
     only what it trained;
  3. server, grouped aggregation: each group's local-adapters, branch weights and head are the
     example-weighted FedAvg over that group's clients (line 12);
  4. server, knowledge sharing: every share-adapter is the example-weighted FedAvg over ALL
     clients (line 16); a client that held branch i frozen counts with the value it received,
     so it need not upload it: S^i <- S^i + (N_i / N) * (FedAvg update of group i's clients).

Choices the paper leaves open, made here:
  * h = GELU; no biases (so Eq. 6 is exact). The same scalar a_i weights branch i's down and up
    matrix. Init: S_d^i = S_u^i = I_r and a_i = 1/M (so sum_i a_i S^i = I_r and the FedAdapter
    starts as a plain bottleneck adapter), W_d Kaiming-uniform, W_u = 0 (the model starts as the
    pretrained one), head N(0, 0.02).
  * Regularisation: a proximal L2 term on the client's own share branch, lambda/2 ||S - S_recv||^2
    (``heterotune-reg``, 0 = off): it keeps the shared knowledge close to the consensus instead
    of fitting one client's model (the paper only says the share-adapter is "constrained").
  * Depth mapping: the share-adapters sit at P positions (``heterotune-share-positions``; 0 = the
    smallest depth among the groups); block j of a model with L blocks uses position
    floor(j * P / L) (relative depth), so equal depths map block to block and a 24-block model
    maps two blocks onto each position of a 12-block one (they then share that branch).
  * The branch weights are part of a group's local state (FedAvg within the group). Table 4's
    ablation "w/o LW" (no learnable weight) is ``heterotune-learnable-weights = false``: every
    a_i stays 1/M, untrained and not sent back; "w/o Reg" is ``heterotune-reg = 0``.
  * The mechanism apart (not in the paper): ``heterotune-sharing = within-group`` keeps the
    architecture, the training and every key above, but each model group holds its own copy of
    the share-adapters (``groups.<g>.share.adapter.<p>.<i>.*``), averaged over that group's
    clients only: Homo-training with HeteroTune's adapters. Group g trains only branch g, so
    the other branches of its copy stay at their start (I_r), and no value crosses groups.
    HeteroTune - this arm is what cross-model sharing adds; this arm - Homo is what the adapters
    add against Homo's full fine-tuning.
  * The FedAdapter replaces the generic adapters: key 'adapter' (lora / bottleneck) is not used;
    'adapter-modules' chooses where FedAdapters sit and 'lora-r' is r. The paper inserts "the
    FedAdapter module into each block" without naming the layer; the default is every method's
    ('last-fc', both sublayers), and a block's two FedAdapters use the share-adapter of their
    position (the paper has one per block). 'last-fc-mlp' gives one FedAdapter per block.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedtune_app.config import ConfigPart, RunConfig, config_key
from fedtune_app.data.groups import group_depths, group_of_name, num_groups, prefix
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method
from fedtune_app.model.adapters import resolve_modules, trainable_parameters
from fedtune_app.model.backbones import build_backbone
from fedtune_app.training.recipes import ClientRecipe

SHARE = "share.adapter."


def share_branch(name: str) -> int | None:
    """The branch i of a share-adapter tensor (``[groups.<g>.]share.adapter.<p>.<i>.*``), else
    None."""
    rest = name.split(".", 2)[2] if group_of_name(name) is not None else name
    return int(rest.split(".")[3]) if rest.startswith(SHARE) else None


def share_positions(cfg: RunConfig) -> int:
    return cfg.own.heterotune_share_positions or min(group_depths(cfg))


def position(block: int, depth: int, positions: int) -> int:
    """Share-adapter position of block ``block`` of a ``depth``-block model (relative depth)."""
    return block * positions // depth


def mix(branches: list[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """sum_i a_i S^i."""
    return sum(w * s for w, s in zip(weights, branches))


class ShareBank(nn.Module):
    """The share-adapters of all positions and branches: ``share.adapter.<p>.<i>.down/up``."""

    def __init__(self, positions: int, groups: int, r: int):
        super().__init__()
        self.adapter = nn.ModuleDict({str(p): nn.ModuleDict({
            str(i): nn.ParameterDict({"down": nn.Parameter(torch.eye(r)),
                                      "up": nn.Parameter(torch.eye(r))})
            for i in range(groups)}) for p in range(positions)})

    def branches(self, p: int, which: str) -> list[torch.Tensor]:
        return [branch[which] for branch in self.adapter[str(p)].values()]


class FedAdapter(nn.Module):
    """A Linear followed by Eq. 5 on its output (Eq. 6 when ``fused`` is on)."""

    fused = False  # set by ``fused_inference``

    def __init__(self, base: nn.Linear, r: int, groups: int, bank: ShareBank, pos: int):
        super().__init__()
        d = base.out_features
        self.base = base
        self.adapter = nn.ParameterDict({"down": nn.Parameter(torch.zeros(d, r)),
                                         "up": nn.Parameter(torch.zeros(r, d)),
                                         "branch": nn.Parameter(torch.full((groups,), 1 / groups))})
        self.__dict__["bank"] = bank  # the model's own, registered once at ``model.share``
        self.pos = pos

    def shared(self) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.adapter["branch"]
        return (mix(self.bank.branches(self.pos, "down"), a),
                mix(self.bank.branches(self.pos, "up"), a))

    def fused_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 6: A' = W_d sum_i a_i S_d^i, B' = (sum_i a_i S_u^i) W_u."""
        s_down, s_up = self.shared()
        return self.adapter["down"] @ s_down, s_up @ self.adapter["up"]

    def forward(self, x):
        y = self.base(x)
        if self.fused:
            a, b = self.fused_matrices()
            return y + nn.functional.gelu(y @ a) @ b
        s_down, s_up = self.shared()
        hidden = nn.functional.gelu((y @ self.adapter["down"]) @ s_down)
        return y + (hidden @ s_up) @ self.adapter["up"]


@contextlib.contextmanager
def fused_inference(model: nn.Module):
    adapters = [m for m in model.modules() if isinstance(m, FedAdapter)]
    for m in adapters:
        m.fused = True
    try:
        yield
    finally:
        for m in adapters:
            m.fused = False


def attach_fedadapters(model, cfg: RunConfig, group: int):
    """FedAdapters on every block's ``adapter-modules`` (in place); trainable: the local
    adapters, branch weights, head and share branch ``group``."""
    m, r, positions = num_groups(cfg.model), cfg.adapter.lora_r, share_positions(cfg)
    modules = resolve_modules(model, cfg.adapter.adapter_modules)
    model.share = ShareBank(positions, m, r)
    for j, block in enumerate(model.blocks):
        for name in modules:
            parent_name, _, leaf = name.rpartition(".")
            parent = block.get_submodule(parent_name) if parent_name else block
            pos = position(j, model.num_blocks, positions)
            setattr(parent, leaf, FedAdapter(getattr(parent, leaf), r, m, model.share, pos))
    model.requires_grad_(False)
    for name, param in model.named_parameters():
        shared = name.startswith(SHARE)
        if (shared and name.split(".")[3] == str(group)) or \
                (not shared and (".adapter." in name or name.startswith("head."))):
            param.requires_grad_(not is_fixed_branch(name, cfg))
    return model


def is_fixed_branch(name: str, cfg: RunConfig) -> bool:
    """A branch weight a_i under Table 4's "w/o LW" ablation: fixed at 1/M."""
    return name.endswith(".adapter.branch") and not cfg.own.heterotune_learnable_weights


class HeteroTuneRecipe(ClientRecipe):
    gradient_bounds: dict[str, float] = {}  # its own loss
    tensor_formulas = {".adapter.A": "HeteroTune fused FedAdapter (Eq. 6) on the Linear's "
                                     "output y: y + gelu(y @ A) @ B"}

    def cache_key(self):
        return (num_groups(self.cfg.model), share_positions(self.cfg),
                self.cfg.own.heterotune_learnable_weights, self.cfg.own.heterotune_sharing)

    def wire(self, name):
        """Share-adapters keep their unprefixed names (one value for every group), unless each
        group holds its own copy (``heterotune-sharing = within-group``)."""
        shared = name.startswith(SHARE) and self.cfg.own.heterotune_sharing == "cross-model"
        return name if shared else super().wire(name)

    def build(self, spec, backbone=build_backbone):
        return attach_fedadapters(backbone(spec), self.cfg, self.group)

    def initial_state(self, model, seed):
        """Seeded, the same on every node; share-adapters do not depend on the group."""
        gen = torch.Generator().manual_seed(seed)
        state = {}
        for name, param in sorted(trainable_parameters(model).items()):
            t = param.detach().cpu().clone()  # identity shares, 1/M branch weights
            if name.endswith(".adapter.down"):
                bound = 1.0 / math.sqrt(param.shape[0])
                t = torch.empty(param.shape).uniform_(-bound, bound, generator=gen)
            elif name.endswith(".adapter.up"):
                t.zero_()
            elif name == "head.weight":
                t = torch.empty(param.shape).normal_(0.0, 0.02, generator=gen)
            elif name.startswith("head."):
                t.zero_()
            state[self.wire(name)] = t.numpy()
        return state

    def received(self, model, plan):
        return {self.wire(n): p for n, p in trainable_parameters(model).items()}

    def trainables(self, model, plan):
        return {n: p for n, p in self.received(model, plan).items() if p.requires_grad}

    def begin(self, params, context):
        self._shares = {n: (p, p.detach().clone()) for n, p in params.items()
                        if share_branch(n) is not None}

    def loss(self, model, plan, inputs, labels):
        loss = nn.functional.cross_entropy(model(inputs, plan), labels)
        lam = self.cfg.own.heterotune_reg
        if lam:
            loss = loss + lam / 2 * sum((p - p0).pow(2).sum() for p, p0 in self._shares.values())
        return loss

    def eval_logits(self, model, plan, inputs):
        with fused_inference(model):
            return {"": model(inputs, plan)}


def fuse_state(state: dict[str, np.ndarray], depths: list[int],
               positions: int) -> dict[str, np.ndarray]:
    """The saved global model, Eq. 6: per group, each FedAdapter's A' and B' (``...adapter.A``,
    ``...adapter.B``) and the head; no share-adapters or branch weights remain. A group's own
    copy of the share-adapters (within-group sharing) is used where the state has one."""
    out = {}
    for name, value in state.items():
        if share_branch(name) is not None or name.endswith(".adapter.up") or \
                name.endswith(".adapter.branch"):
            continue
        if not name.endswith(".adapter.down"):
            out[name] = value
            continue
        base = name.removesuffix("down")
        g, j = int(name.split(".")[1]), int(name.split(".")[3])
        p, a = position(j, depths[g], positions), state[base + "branch"]
        share = prefix(g) + SHARE if prefix(g) + SHARE + "0.0.down" in state else SHARE
        s = {w: sum(a[i] * state[f"{share}{p}.{i}.{w}"] for i in range(len(a)))
             for w in ("down", "up")}
        out[base + "A"] = value @ s["down"]
        out[base + "B"] = s["up"] @ state[base + "up"]
    return out


class HeteroTune(GroupStrategy):
    name = "heterotune"
    feddyn_server_step = False  # Alg. 1's aggregate is all: no FedDyn server step

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.shared = sorted(n for n in self.state if n.startswith(SHARE))
        self.group_of = {str(c.partition_id): c.model_group for c in self.clients}

    def admit(self, client):
        self.group_of[str(client.partition_id)] = client.model_group

    def client_payload(self, client, plan):
        return super().client_payload(client, plan) + self.shared

    def reply_names(self, client, names):
        """Its group's tensors and its own share branch, less fixed branch weights."""
        own, g = prefix(client.model_group), client.model_group
        return [n for n in names if share_branch(n) in (None, g)
                and not is_fixed_branch(n, self.cfg) and (n.startswith(own) or n.startswith(SHARE))]

    def aggregate(self, updates):
        # Alg. 1 line 16 averages each share-adapter over all clients: a frozen branch counts
        # with the value the client received (this round's state), as if it had been sent back
        full = [ClientUpdate(u.client, {n: self.state[n] for n in self.shared} | u.tensors,
                             u.num_examples) for u in updates]
        return self.combine(full)

    def export_state(self):
        return fuse_state(self.state, self.depths, share_positions(self.cfg))


@dataclass(frozen=True)
class HeteroTuneConfig(ConfigPart):
    """HeteroTune's own keys."""
    heterotune_reg: float = config_key(0.01, minimum=0, help=
        "HeteroTune: weight lambda of the proximal L2 regularisation lambda/2 ||S - S_received||^2"
        " of a client's own share-adapter branch (0 = off); rank r = key 'lora-r'")
    heterotune_learnable_weights: bool = config_key(True, help=
        "HeteroTune: train the branch weights a_i of the cross-model aggregator (false: fixed at "
        "1/M, Table 4's 'w/o LW' ablation; 'w/o Reg' is heterotune-reg = 0)")
    heterotune_sharing: str = config_key("cross-model", choices=("cross-model", "within-group"),
                                         help=
        "HeteroTune: 'cross-model' (the paper, Alg. 1 line 16: every share-adapter averaged over "
        "all clients) or 'within-group' (each model group its own copy of the share-adapters, "
        "averaged over its own clients: Homo-training with HeteroTune's adapters, no cross-model "
        "sharing; not in the paper, it takes the mechanism apart)")
    heterotune_share_positions: int = config_key(0, minimum=0, help=
        "HeteroTune: share-adapter positions P; block j of an L-block model uses position "
        "floor(j*P/L) (0 = the smallest depth among the model groups)")


register_method("heterotune", group_strategy=HeteroTune, recipe=HeteroTuneRecipe,
                config=HeteroTuneConfig)
