"""Clients that differ in LoRA rank: the factor algebra, strategy and client recipe that the
LoRA-aggregation methods share (FedIT, HetLoRA, FlexLoRA, FLoRA, FFA-LoRA, FedSA-LoRA,
FedEx-LoRA; one module each beside this one).

Rank as a capacity. The global LoRA of an adapted Linear (d_in -> d_out) has rank R = 'lora-r',
the largest rank any client may hold: A is R x d_in, B is d_out x R. A client of rank r holds
the first r components: rows 0..r-1 of A and columns 0..r-1 of B, and only those travel. On
the client the model keeps rank R with the other components zero, which is exactly a rank-r
LoRA: a zero row of A faces a zero column of B, both get zero gradients and stay zero under
SGD, momentum, weight decay and AdamW. Component j of a block's LoRA is thus held by the
clients that hold the block and whose rank exceeds j, and the masked weighted mean of FedRA's
Eq. 2 generalises one level down (``component_mean``): each component is averaged over its
holders; one nobody held keeps its value. Depth and rank combine in one run: the allocation is
FedRA's (a client of capacity L holds every block), so 'capacities' and 'ranks' together say
whether a device spends its budget on layers or on rank.

Scaling. Every client's LoRA is scaled by s = lora-alpha / lora-r whatever its rank, as in
FLoRA's official code (a rank-r_i client gets alpha = 2 r_i: the same factor 2 for every rank),
so the products B_i A_i of clients of different ranks add up on one scale.

Merging into the frozen weight. A method that merges an aggregate into the base weights (FLoRA,
FedEx-LoRA) keeps, per adapted Linear, ``blocks.<j>.<module>.lora_delta`` (d_out x d_in):
W = W0 + lora_delta + s B A. Frozen weights never travel, so the server sends the delta with the
block's payload (named by global block position like every trainable tensor, counted in
bytes-down) and the client adds it to its frozen weight; it is never trained or sent back.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from fedtune_app.config import ConfigError, RunConfig
from fedtune_app.data.scenarios import check_rank
from fedtune_app.federated.aggregation import ClientUpdate, masked_weighted_mean
from fedtune_app.federated.records import from_record, to_record
from fedtune_app.methods.fedra import FedRA
from fedtune_app.model.adapters import global_name, initial_state, trainable_parameters
from fedtune_app.training.recipes import ClientRecipe

A, B = ".lora_A.weight", ".lora_B.weight"
DELTA = ".lora_delta"
LORA_RANK = "lora-rank"  # the train task's entry: the rank the client holds this round


def factor(name: str) -> str | None:
    """'A' or 'B' for a LoRA factor's name, else None."""
    return "A" if name.endswith(A) else "B" if name.endswith(B) else None


def module_of(name: str) -> str:
    """``blocks.3.mlp.fc2.lora_A.weight`` -> ``blocks.3.mlp.fc2``."""
    return name.removesuffix(A).removesuffix(B).removesuffix(DELTA)


def lora_modules(names) -> list[str]:
    """The adapted Linear layers (``blocks.j.<module>``) among ``names``, in name order."""
    return sorted({module_of(n) for n in names if factor(n)})


def rank_of(name: str, value: np.ndarray) -> int:
    return value.shape[0] if factor(name) == "A" else value.shape[1]


def truncate(name: str, value: np.ndarray, r: int) -> np.ndarray:
    """The first r components of a factor (other tensors as they are)."""
    kind = factor(name)
    return value[:r] if kind == "A" else value[:, :r] if kind == "B" else value


def pad(name: str, value: np.ndarray, top: int) -> np.ndarray:
    """A factor of rank r <= top zero-padded to rank ``top`` (HetLoRA's zero-padding)."""
    kind = factor(name)
    if kind is None or (r := rank_of(name, value)) == top:
        return value
    out = np.zeros((top, value.shape[1]) if kind == "A" else (value.shape[0], top), value.dtype)
    if kind == "A":
        out[:r] = value
    else:
        out[:, :r] = value
    return out


def product(tensors: dict[str, np.ndarray], module: str) -> np.ndarray:
    """B A of one adapted Linear, in float64."""
    return tensors[module + B].astype(np.float64) @ tensors[module + A].astype(np.float64)


def explode(tensors: dict[str, np.ndarray], ranks: int | None = None) -> dict[str, np.ndarray]:
    """Every factor split into its rank components ``<name>#<j>`` (row j of A, column j of B),
    the first ``ranks`` of them (None: all); other tensors as they are."""
    out = {}
    for name, value in tensors.items():
        kind = factor(name)
        if kind is None:
            out[name] = value
            continue
        r = rank_of(name, value) if ranks is None else ranks
        for j in range(r):
            out[f"{name}#{j}"] = value[j] if kind == "A" else value[:, j]
    return out


def implode(components: dict[str, np.ndarray],
            like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of ``explode`` onto the full-rank tensors of ``like``."""
    out = {}
    for name, value in like.items():
        kind = factor(name)
        if kind is None:
            out[name] = components.get(name, value)
            continue
        parts = [components[f"{name}#{j}"] for j in range(rank_of(name, value))]
        out[name] = np.stack(parts, axis=0 if kind == "A" else 1).astype(value.dtype)
    return out


def holder_weights(updates: list[ClientUpdate], module: str) -> list[tuple[ClientUpdate, float]]:
    """The clients that sent ``module``'s LoRA, each with p_i = |D_i| / sum of theirs."""
    held = [u for u in sorted(updates, key=lambda u: u.client) if module + A in u.tensors
            or module + B in u.tensors]
    total = float(sum(u.num_examples for u in held))
    return [(u, u.num_examples / total) for u in held]


def mean_product(updates: list[ClientUpdate], module: str) -> np.ndarray | None:
    """sum_i p_i B_i A_i over the module's holders (None: nobody held it)."""
    held = holder_weights(updates, module)
    if not held:
        return None
    return sum(p * product(u.tensors, module) for u, p in held)


def kaiming_a(shape, rng: np.random.Generator) -> np.ndarray:
    """A fresh LoRA A as peft draws it: Kaiming-uniform, bound 1 / sqrt(d_in)."""
    bound = 1.0 / np.sqrt(shape[1])
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


class RankStrategy(FedRA):
    """The rank methods' server: FedRA's allocation, each client sent the first r_i components
    of its blocks' factors (its ``lora-rank`` in the train task), replies zero-padded back to
    rank R at the boundary (a reply of another rank is rejected), and by default the
    component-masked weighted mean (FedIT's FedAvg of A and B, per component)."""

    rank_heterogeneous = True
    sends_delta = False  # the block payload carries ``lora_delta`` (merged methods)
    sent_factors = ("A", "B")  # what the server sends of each LoRA
    returned_factors = ("A", "B")  # what a client sends back

    def __init__(self, cfg: RunConfig, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.top = cfg.adapter.lora_r
        self.scale = cfg.adapter.lora_alpha / cfg.adapter.lora_r  # s, every client's
        for c in self.clients:
            self.admit(c)
        self.round_ranks: dict[int, int] = {}  # partition id -> rank it was sent this round

    def admit(self, client) -> None:
        check_rank(self.rank(client), self.top, f"partition {client.partition_id}'s LoRA rank")

    def rank(self, client) -> int:
        """The rank this client holds (declared by its node; 0 = not declared: 'lora-r')."""
        return client.rank or self.top

    def client_payload(self, client, plan):
        names = super().client_payload(client, plan)
        return [n for n in names if (factor(n) is None or factor(n) in self.sent_factors)
                and (self.sends_delta or not n.endswith(DELTA))]

    def reply_names(self, client, names):
        return [n for n in names if not n.endswith(DELTA)
                and (factor(n) is None or factor(n) in self.returned_factors)]

    def train_config(self, client, plan):
        return {LORA_RANK: self.rank(client)}

    def trained_size(self, partition_id, name):
        """The first r_i components of a factor: the rank the client held this round."""
        r = self.round_ranks.get(partition_id, self.top)
        return int(truncate(name, self.state[name], r).size)

    def client_tensors(self, client, plan):
        r = self.round_ranks[client.partition_id] = self.rank(client)
        return {n: np.ascontiguousarray(truncate(n, self.state[n], r))
                for n in self.client_payload(client, plan)}

    def expected_reply(self, client, sent):
        """Padded to rank R, like the replies (``received_tensors``); a factor a client trains
        but is not sent (FedSA-LoRA's local B) is expected too, measured from zero."""
        out = {n: pad(n, v, self.top) for n, v in sent.items()
               if n in self.reply_names(client, list(sent))}
        for module in lora_modules(sent):
            for kind, suffix in (("A", A), ("B", B)):
                if kind in self.returned_factors and module + suffix not in out:
                    out[module + suffix] = np.zeros_like(self.state[module + suffix])
        return out

    def received_tensors(self, client, tensors):
        """Each factor must have the rank the client was sent; it is zero-padded to R."""
        r = self.round_ranks[client.partition_id]
        for name, value in tensors.items():
            if factor(name) and (value.ndim != 2 or rank_of(name, value) != r):
                want = truncate(name, self.state[name], r).shape
                raise ValueError(f"'{name}' has shape {value.shape}, expected {want}: rank {r}, "
                                 "the LoRA rank the client was sent")
        return {n: pad(n, v, self.top) for n, v in tensors.items()}

    def component_mean(self, updates: list[ClientUpdate]) -> dict[str, np.ndarray]:
        """Each rank component of each factor averaged over its holders (the clients whose
        rank exceeds its index), every other tensor over the clients that sent it; through the
        run's aggregator ('aggregator', DP)."""
        ranks = {u.client: self.round_ranks[int(u.client)] for u in updates}
        split = [ClientUpdate(u.client, explode(u.tensors, ranks[u.client]), u.num_examples)
                 for u in updates]
        return implode(self.combine(split, state=explode(self.state)), self.state)

    def aggregate(self, updates):
        return self.server_objective(updates, self.component_mean(updates))

    def plain_mean(self, updates: list[ClientUpdate]) -> dict[str, np.ndarray]:
        """The example-weighted mean of the tensors that are no LoRA factor (the head)."""
        rest = [ClientUpdate(u.client, {n: v for n, v in u.tensors.items() if not factor(n)},
                             u.num_examples) for u in updates]
        return masked_weighted_mean(self.state, rest)


def check_exact(cfg: RunConfig) -> None:
    """A method whose server multiplies the clients' factors: only the plain weighted mean of
    those products is defined (robust aggregators and DP would need their own products)."""
    if cfg.robust.aggregator != "mean":
        raise ConfigError(f"run-config key 'aggregator' = {cfg.robust.aggregator!r} with method "
                          f"{cfg.method!r}: its server aggregates the products B_i A_i of the "
                          "clients' factors, defined for the weighted mean only; use "
                          "aggregator = mean (robust aggregators: fedit, ffa-lora, fedsa-lora)")


def check_rank_method(cfg: RunConfig) -> None:
    """Rules every rank method shares."""
    if cfg.adapter.adapter != "lora":
        raise ConfigError(f"run-config key 'adapter' = {cfg.adapter.adapter!r} with method "
                          f"{cfg.method!r}: it aggregates LoRA factors; use adapter = lora")
    if cfg.robust.aggregator == "fltrust":
        raise ConfigError(f"run-config key 'aggregator' = 'fltrust' with method {cfg.method!r}: "
                          "the server's root-set update is not split into rank components")


class RankRecipe(ClientRecipe):
    """A client of rank r: the received factors fill the first r components of its rank-R
    LoRA, the others are zero; it sends back the first r (HetLoRA: fewer after pruning)."""

    sent_factors = ("A", "B")
    trained_factors = ("A", "B")
    receives_delta = False  # the server sends ``lora_delta`` (FLoRA, FedEx-LoRA)
    has_delta = False  # the model carries ``lora_delta`` (those, and FlexLoRA's server)
    # for exports: the delta changes what the model predicts, and no peft module holds it
    tensor_formulas = {"lora_delta": "W = W0 + lora_delta + (lora_alpha / r) B A"}
    predicting_tensors = ("lora_delta",)

    def extend(self, model):
        """With ``has_delta``, every adapted Linear gets its ``lora_delta`` (zero; frozen),
        added to its output."""
        if not self.has_delta:
            return model
        for module in model.modules():
            if hasattr(module, "lora_A") and hasattr(module, "base_layer"):
                base = module.base_layer
                delta = torch.zeros(base.out_features, base.in_features)
                module.register_parameter("lora_delta", nn.Parameter(delta, requires_grad=False))
                module.register_forward_hook(_add_delta)
        return model

    def _all(self, model, plan) -> dict[str, nn.Parameter]:
        subnet = model.subnetwork(plan)
        return {self.wire(global_name(n, plan)): p
                for n, p in trainable_parameters(subnet).items()}

    def trainables(self, model, plan):
        return {n: p for n, p in self._all(model, plan).items() if not n.endswith(DELTA)
                and (factor(n) is None or factor(n) in self.trained_factors)}

    def received(self, model, plan):
        return {n: p for n, p in self._all(model, plan).items()
                if (self.receives_delta if n.endswith(DELTA)
                    else factor(n) is None or factor(n) in self.sent_factors)}

    def configure(self, config):
        super().configure(config)
        self.rank = int(config[LORA_RANK])

    def own_factor(self, model, name: str) -> np.ndarray | None:
        """A factor the server does not send, at full rank R (FFA-LoRA's frozen A), or None
        (FedSA-LoRA's B: set from the node's own state in ``begin``)."""
        return None

    def assign(self, model, plan, received):
        loaded, everything = self.received(model, plan), self._all(model, plan)
        if set(received) != set(loaded):
            raise ValueError(f"server sent {len(received)} tensors, the plan {plan} has "
                             f"{len(loaded)} tensors to load: "
                             f"{sorted(set(received) ^ set(loaded))[:3]}")
        r = self.rank
        with torch.no_grad():
            for name, param in everything.items():
                kind = factor(name)
                value = received.get(name)
                if kind is None:
                    if value is not None:
                        param.copy_(torch.as_tensor(value))
                    continue
                if value is None:
                    value = self.own_factor(model, name)
                    value = None if value is None else truncate(name, value, r)
                elif value.ndim != 2 or rank_of(name, value) != r:
                    raise ValueError(f"server sent '{name}' with shape {value.shape}: not the "
                                     f"rank {r} this round's task names")
                param.zero_()
                if value is not None:
                    (param[:r] if kind == "A" else param[:, :r]).copy_(torch.as_tensor(value))
        self.pairs = [(everything[m + A], everything[m + B]) for m in lora_modules(everything)]

    def reply_rank(self) -> int:
        """The rank the trained factors are sent back at."""
        return self.rank

    def trained(self, params):
        r = self.reply_rank()
        return {n: np.ascontiguousarray(truncate(n, p.detach().cpu().numpy(), r))
                for n, p in params.items()}


def _add_delta(module, args, output):
    """Forward hook: the merged aggregate's delta added to the frozen weight's output."""
    return output + nn.functional.linear(args[0], module.lora_delta)


def seeded_factor(model, cfg: RunConfig, name: str) -> np.ndarray:
    """A factor at the run's seeded initial value (``adapters.initial_state``: the same draw on
    every node), worked out once per model (FFA-LoRA's frozen A)."""
    if getattr(model, "seeded_state", None) is None:
        model.seeded_state = initial_state(model, cfg.seed)
    return model.seeded_state[name]


def node_factors(context: Context, key: str) -> dict[str, np.ndarray]:
    """The factors a node keeps from round to round (FedSA-LoRA's B) in its ``context.state``."""
    return from_record(context.state[key]) if key in context.state else {}


def keep_node_factors(context: Context, key: str, tensors: dict[str, np.ndarray]) -> None:
    context.state[key] = to_record(node_factors(context, key) | tensors)
