"""Trainable parameters: LoRA (peft) or a bottleneck adapter in chosen Linear layers of every
block, plus the classification head. Everything else stays frozen.

Wire/server names are the model's parameter names with peft's adapter name removed:
``blocks.3.output.dense.lora_A.weight``, ``blocks.3.mlp.fc2.adapter.down.weight``, ``head.bias``.
The block index in a name is always GLOBAL (the model holds all L blocks; a plan only chooses
which of them run).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedtune_app.config import AdapterConfig, ConfigError
from fedtune_app.model.backbones import LayeredModel

# Per backbone family: the last fully connected layer of each of a block's two sublayers (l^0:
# attention or token mixing, l^1: MLP). FedRA puts LoRA on both (v1 Sec. 3.2; its code targets
# attn.proj and mlp.fc2, mlp_tokens.fc2 and mlp_channels.fc2), which gives FedBRICK Table 3's
# 43.0 K LoRA parameters per ViT-B layer at r = 8. A new family adds its pair here; a model's
# family is the entry whose two layers its blocks have.
SUBLAYER_LAST_FC = {
    "vit": ("attn.proj", "mlp.fc2"),
    "mixer": ("mlp_tokens.fc2", "mlp_channels.fc2"),
    "bert": ("attention.output.dense", "output.dense"),
    "mpnet": ("attention.attn.o", "output.dense"),
    "llama": ("self_attn.o_proj", "mlp.down_proj"),
}
# 'adapter-modules' shorthands -> which sublayers (FedRA Table 6's rows)
POSITIONS = {"last-fc": (0, 1), "last-fc-attn": (0,), "last-fc-mlp": (1,)}
PEFT_ADAPTER = "default"
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


@dataclass(frozen=True)
class AdapterSpec:
    kind: str = "lora"  # lora | bottleneck
    modules: str = "last-fc"
    r: int = 8
    alpha: float = 8.0
    dropout: float = 0.1
    full: bool = False  # 'client-trains = full': no adapters, every parameter trains

    @classmethod
    def from_config(cls, adapter: AdapterConfig) -> "AdapterSpec":
        return cls(adapter.adapter, adapter.adapter_modules, adapter.lora_r, adapter.lora_alpha,
                   adapter.lora_dropout, adapter.client_trains == "full")


class BottleneckAdapter(nn.Module):
    """Houlsby-style adapter on a Linear's output: y + up(gelu(down(y))); ``up`` starts at zero
    so the adapted model starts equal to the pretrained one."""

    def __init__(self, base: nn.Linear, r: int):
        super().__init__()
        self.base = base
        self.adapter = nn.ModuleDict({"down": nn.Linear(base.out_features, r),
                                      "up": nn.Linear(r, base.out_features)})

    def forward(self, x):
        y = self.base(x)
        return y + self.adapter["up"](nn.functional.gelu(self.adapter["down"](y)))


def sublayer_last_fc(model: LayeredModel) -> tuple[str, str]:
    """(attention, MLP) last fully connected layer of this model's blocks."""
    linears = {n for n, m in model.blocks[0].named_modules() if isinstance(m, nn.Linear)}
    for pair in SUBLAYER_LAST_FC.values():
        if set(pair) <= linears:
            return pair
    raise ConfigError(f"run-config key 'adapter-modules': this backbone has no known last "
                      f"fully connected layers (families: {', '.join(SUBLAYER_LAST_FC)}); give "
                      f"its Linear names instead: {', '.join(sorted(linears))}")


def resolve_modules(model: LayeredModel, modules: str) -> list[str]:
    """Block-relative Linear names, checked against block 0."""
    if modules in POSITIONS:
        pair = sublayer_last_fc(model)
        return [pair[i] for i in POSITIONS[modules]]
    names = [m.strip() for m in modules.split(",") if m.strip()]
    linears = sorted(n for n, m in model.blocks[0].named_modules() if isinstance(m, nn.Linear))
    for name in names:
        if name not in linears:
            raise ConfigError(f"run-config key 'adapter-modules': {name!r} is not a Linear layer "
                              f"of a block; allowed: {', '.join(POSITIONS)}, {', '.join(linears)}")
    return names


def attach_adapters(model: LayeredModel, spec: AdapterSpec) -> LayeredModel:
    """Insert adapters into every block (in place) and mark adapters + head trainable; with
    ``spec.full`` no adapters: every parameter trainable (full fine-tuning)."""
    model.fine_tunes_all = spec.full  # read by ``trainable_parameters`` (sub-networks copy it)
    modules = [] if spec.full else resolve_modules(model, spec.modules)
    if spec.kind == "lora" and modules:
        from peft import LoraConfig, inject_adapter_in_model

        pattern = r"blocks\.\d+\.(?:" + "|".join(re.escape(m) for m in modules) + ")"
        config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                            target_modules=pattern)
        inject_adapter_in_model(config, model, adapter_name=PEFT_ADAPTER)
    else:  # bottleneck adapters (none with full fine-tuning)
        for block in model.blocks:
            for name in modules:
                parent_name, _, leaf = name.rpartition(".")
                parent = block.get_submodule(parent_name) if parent_name else block
                setattr(parent, leaf, BottleneckAdapter(getattr(parent, leaf), spec.r))
    model.requires_grad_(False)
    for param in trainable_parameters(model).values():
        param.requires_grad_(True)
    return model


ADDED = "added_by_method"  # the mark of a module a method adds: its initialisation kind


def add_trained_module(model: nn.Module, name: str, module: nn.Module,
                       init: str = "zeros") -> nn.Module:
    """Add ``module`` to ``model`` as ``name``, marked as a module the method adds (DepthFL's
    exits, FedBRICK's BRICKs): it trains, travels and is aggregated like the adapters.
    ``init``: 'classifier' (like the head: weight N(0, 0.02), bias 0, drawn after every other
    tensor, so those are the same with or without it) or 'zeros' (the recipe sets it)."""
    setattr(module, ADDED, init)
    module.requires_grad_(True)
    setattr(model, name, module)
    return module


def added_modules(model: nn.Module) -> dict[str, str]:
    """Name prefix (``exits.``) -> initialisation kind, of every module a method added."""
    return {f"{name}.": getattr(m, ADDED) for name, m in model.named_children()
            if hasattr(m, ADDED)}


def is_adapter_name(param_name: str) -> bool:
    return ".lora_" in param_name or ".adapter." in param_name


def is_trainable_name(param_name: str, added: dict[str, str]) -> bool:
    """Adapters, the head, and the modules a method added (``added_modules``)."""
    return is_adapter_name(param_name) or param_name.startswith(("head.", *added))


def added_parameters(model: nn.Module) -> set[int]:
    """Ids of the parameters the pretrained backbone does not have (adapters, added modules)."""
    added = tuple(added_modules(model))
    return {id(p) for n, p in model.named_parameters()
            if is_adapter_name(n) or n.startswith(added)}


def wire_name(param_name: str) -> str:
    return param_name.replace(f".{PEFT_ADAPTER}.", ".")


def trainable_parameters(model: LayeredModel) -> dict[str, nn.Parameter]:
    """wire name -> parameter, for every trainable tensor of the model (all L blocks); with
    full fine-tuning (``attach_adapters``) every parameter: stem, blocks, final norm, head."""
    full, added = getattr(model, "fine_tunes_all", False), added_modules(model)
    return {wire_name(n): p for n, p in model.named_parameters()
            if full or is_trainable_name(n, added)}


def block_of(name: str) -> int | None:
    """Global block index a trainable tensor belongs to, or None for shared parts (head)."""
    match = _BLOCK.match(name)
    return int(match.group(1)) if match else None


def global_name(local: str, plan) -> str:
    """``blocks.<i>.x`` of a sub-network -> ``blocks.<plan[i]>.x`` of the global model."""
    block = block_of(local)
    return local if block is None else _BLOCK.sub(f"blocks.{plan[block]}.", local, count=1)


def local_name(global_: str, plan) -> str:
    block = block_of(global_)
    return global_ if block is None else _BLOCK.sub(f"blocks.{plan.index(block)}.", global_,
                                                     count=1)


def names_for_plan(all_names, plan) -> list[str]:
    """The payload of a plan: trainables of the planned blocks plus the shared ones (head)."""
    held = set(plan)
    return [n for n in all_names if (b := block_of(n)) is None or b in held]


def initial_state(model: LayeredModel, seed: int) -> dict[str, np.ndarray]:
    """Seeded initial trainable state, the same on every machine: LoRA A / adapter down
    Kaiming-uniform (peft's default), LoRA B / adapter up zero (so round 0 is the pretrained
    model), head (and extra heads) weight N(0, 0.02), biases zero. Extra heads are drawn last,
    so the other tensors are the same with or without them. Full fine-tuning: the backbone's
    parameters start at the model's (pretrained) values and draw nothing."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    added = added_modules(model)
    classifiers = tuple(p for p, kind in added.items() if kind == "classifier")
    order = sorted(trainable_parameters(model).items(),
                   key=lambda kv: (kv[0].startswith(classifiers), kv[0]))
    for name, param in order:
        t = torch.zeros(param.shape, dtype=torch.float32)
        if not is_trainable_name(name, added):  # a backbone weight (full fine-tuning)
            t = param.detach().to("cpu", torch.float32).clone()
        elif name.endswith("weight") and (".lora_A." in name or ".adapter.down." in name):
            bound = 1.0 / math.sqrt(param.shape[1])  # kaiming_uniform_(a=sqrt(5))
            t.uniform_(-bound, bound, generator=gen)
        elif name.startswith(("head.", *classifiers)) and name.endswith("weight"):
            t.normal_(0.0, 0.02, generator=gen)
        state[name] = t.numpy()
    return state


def load_state(model: LayeredModel, state: dict[str, np.ndarray]) -> None:
    """Copy received tensors into the model's trainable parameters (in place, no realloc)."""
    params = trainable_parameters(model)
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(torch.as_tensor(value))
