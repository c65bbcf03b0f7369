"""FedBRICK: federated bias recovery via inserted calibrative kernels (seed 004, Eq. 17-24).

A BRICK stands in for a block a client does not hold (Eq. 17-19), for x of width d:
    x1 = B1 A1 x,  x2 = B2 A2 x,  E(x) = x * softmax(x1) + x2 + x       (A: r x d, B: d x r)
i.e. 4rd parameters. There is one BRICK per domain c and block position l, on the wire as
``bricks.<c>.<l>.<A1|B1|A2|B2>``; the server keeps them in its state next to the adapters.

Per round t (FedRA allocation, Eq. 2/3, decides the plans S_k):
  1. server, at the start of the round, per domain c (Eq. 20: "At the beginning of the t-th
     communication round ... After distillation, each client k receives ..."): layer-wise
     distillation of every BRICK theta_{c,l} against the global block f_l(.; w^t) (the global
     adapters loaded) on the server's proxy set D_proxy^(c):  min MSE(E_{c,l}(a_{l-1}),
     f_l(a_{l-1})), a_{l-1} = the global model's input to block l; ``fedbrick-server-epochs``
     epochs (paper: 10). Round 1's clients thus get BRICKs distilled against the pretrained
     blocks, not the near-identity initial ones;
  2. client k of domain c(k) gets its planned blocks' trainables w_l (l in S_k), the head and
     ALL L BRICKs theta_{c(k),.} of its domain;
  3. stage I (Eq. 21): BRICKs fill the missing positions; train w_l (l in S_k), the head and
     theta_{c,l} (l not in S_k) on
         CE(y, y_hat) + lambda_w sum_{l in S_k} ||w_l - w_l^t||^2
                      + lambda_theta sum_{l not in S_k} ||theta_{c,l} - theta_{c,l}^t||^2;
  4. stage II (Eq. 22-24): each retained block runs in parallel with its BRICK,
         a_l = alpha_e f_l(a_{l-1}) + (1 - alpha_e) E_l(a_{l-1}),  alpha_e = 1 - e / E2,
     missing positions use their (now fixed) BRICK; train theta_{c,l} (l in S_k) only, on
         CE(y, z_hat) + lambda_d / |S_k| sum_{l in S_k} MSE(E_l(a_{l-1}), f_l(a_{l-1}));
  5. server: masked example-weighted mean of every tensor over the clients that sent it
     (backbone trainables and head as FedRA; a domain's BRICKs over that domain's clients),
     then the local objective's server step (FedDyn's correction with
     ``local-objective = feddyn``; the paper uses plain FedAvg).
The global model (evaluation) is the plain backbone with all L blocks; BRICKs are client-side
helpers only.

Overheads reported per round (paper Table 3 and its overhead paragraph): ``brick-params`` (per
client: the L BRICKs it stores), ``brick-share`` (those over its sub-network's parameters),
``brick-bytes-down/up`` (BRICK bytes in the payloads and the accepted replies: the extra
communication), ``server-distill-seconds`` and ``server-distill-mse`` (per domain: mean
layer-wise MSE in the first and the last epoch).

Choices made here (the paper leaves them open):
  * Init: A1, A2 Kaiming-uniform (bound 1/sqrt(d), as LoRA's A), B1 = B2 = 0, drawn from their own
    seeded generator (the adapters and the head are the same as FedRA's for the same seed). A
    fresh BRICK is then E(x) = x * softmax(0) + x = (1 + 1/d) x: identity up to 1/d.
  * softmax runs over the d features of each token; BRICKs act on every token (for text, padding
    tokens too). ||.||^2 of Eq. 20/24 is the mean squared error over batch, tokens and features
    (the paper calls it MSE), so lambda_d does not scale with d; the proximal terms of Eq. 21 are
    plain sums of squares over the tensors.
  * Eq. 21's lambda_w tethers the retained blocks' trainables (adapters); the head is trained but
    not tethered (the equation names only w_l, l in S_k).
  * Stage I runs ``local-epochs``, stage II ``fedbrick-stage2-epochs`` (the paper: "each
    performing one local epoch ... in both stages"; its Stage II text also says "only a few local
    steps": ``fedbrick-stage2-steps`` caps each stage-II epoch at that many batches), both at
    ``lr`` with the run's ``optimizer``. E2 = stage II's optimizer steps; step e = 0..E2-1
    uses alpha_e = 1 - e/E2
    (1 at the first step; alpha_E2 = 0 would be the step after the last). Stage II's
    distillation term sees a_{l-1} detached (layer-wise: each BRICK learns its own block) and
    f_l's output as a fixed target. Stage II shuffles with seed + 1. The reported train loss is
    stage I's.
  * Domains: the data set's domains when clients are split by domain (feature skew: a client's
    domain is the group it reports); otherwise one group ``all`` for every client.
  * Proxy set: ``proxy-fraction`` (5%) of every domain's training examples, at least one, drawn
    with a fixed seed (``data.proxy_indices``). The server "owns only a small portion of public
    proxy data": by default it is taken out of the clients' partitions (nobody's private data;
    comparators train on exactly the same client data with ``proxy-for-all-methods``);
    ``proxy-held-out = false`` leaves it in the clients' data too (a public set the clients
    also hold).
  * Server distillation: ``fedbrick-server-optimizer`` (Adam; the paper names no optimizer)
    at ``fedbrick-server-lr`` (the paper's "server learning rate of 1e-4"), batches of
    ``batch-size``, every domain every round (also domains no sampled client
    had: the global blocks moved for them too); each batch runs the frozen global model once and
    updates all L BRICKs of the domain (their losses are independent).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from fedtune_app.config import ConfigError, ConfigPart, RunConfig, config_key
from fedtune_app.data.splits import domain_list, proxy_indices, run_splits
from fedtune_app.methods.fedra import FedRA
from fedtune_app.methods.registry import register_method
from fedtune_app.model.adapters import add_trained_module, block_of, load_state, names_for_plan
from fedtune_app.model.progress import Progress
from fedtune_app.training.local import to_device, train_local
from fedtune_app.training.recipes import ClientRecipe

ALL = "all"  # the one BRICK group when clients are not split by domain
BRICK_SEED = 0xB41C  # offset of the BRICKs' own init generator


class Brick(nn.Module):
    """E(x) = x * softmax(B1 A1 x) + B2 A2 x + x over the last dimension (Eq. 17-19)."""

    def __init__(self, d: int, r: int):
        super().__init__()
        self.A1, self.A2 = (nn.Parameter(torch.zeros(r, d)) for _ in range(2))
        self.B1, self.B2 = (nn.Parameter(torch.zeros(d, r)) for _ in range(2))

    def forward(self, x):
        x1 = x @ self.A1.T @ self.B1.T
        x2 = x @ self.A2.T @ self.B2.T
        return x * torch.softmax(x1, dim=-1) + x2 + x


def brick_domains(cfg: RunConfig) -> list[str]:
    """One BRICK group per domain when clients are split by domain, else one for all."""
    domains = domain_list(cfg.data)
    if not domains or not cfg.data.partitioner.startswith("domain"):
        return [ALL]
    return list(domains)


def anneal(step: int, total: int) -> float:
    """alpha of stage II step ``step`` of ``total`` (Eq. 22)."""
    return 1.0 - step / total


def forward_with_bricks(model, plan, bricks: nn.ModuleDict, inputs, alpha: float | None = None):
    """(logits, pairs). Every position l not in ``plan`` runs its BRICK; a planned block runs
    alone (stage I, ``alpha`` None) or mixed with its BRICK, alpha f_l + (1 - alpha) E_l (stage
    II, Eq. 23), and then ``pairs`` holds (E_l(a), f_l(a)) on the detached input a, per
    planned l, for the distillation term of Eq. 24."""
    x, ctx = model.embed(inputs)
    held, pairs = set(plan), []
    for l in range(model.num_blocks):
        brick = bricks[str(l)]
        if l not in held:
            x = brick(x)
        elif alpha is None:
            x = model.run_block(model.blocks[l], x, ctx)
        else:
            block_out = model.run_block(model.blocks[l], x, ctx)
            pairs.append((brick(x.detach()), block_out.detach()))
            x = alpha * block_out + (1 - alpha) * brick(x)
    return model.classify(x, ctx), pairs


def block_io(model, inputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every block of the full global model (the teacher of Eq. 20)."""
    x, ctx = model.embed(inputs)
    out = []
    for block in model.blocks:
        y = model.run_block(block, x, ctx)
        out.append((x, y))
        x = y
    return out


def layer_mse(bricks: nn.ModuleDict, io) -> torch.Tensor:
    """Sum over positions l of MSE(E_l(a_{l-1}), f_l(a_{l-1})) (Eq. 20)."""
    return sum(nn.functional.mse_loss(bricks[str(l)](x), y) for l, (x, y) in enumerate(io))


def distill_bricks(model, bricks: nn.ModuleDict, data, epochs: int, lr: float, batch_size: int,
                   seed: int, device, optimizer: str = "adam",
                   what: str = "fedbrick server distillation") -> tuple[float, float]:
    """Eq. 20 for one domain: ``optimizer`` (Adam, or plain SGD) on the BRICKs against the
    frozen global blocks. Returns the mean layer-wise MSE of the first and of the last epoch.
    A run of more than a few seconds logs its progress (``what``: the phase's name)."""
    optimizer = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(
        bricks.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    per_epoch = []
    progress = Progress(what, epochs * data.num_batches(batch_size))
    for _ in range(epochs):
        total, count = 0.0, 0
        for inputs, _ in data.batches(batch_size, generator=gen):
            inputs = to_device(inputs, device)
            with torch.no_grad():
                io = block_io(model, inputs)
            loss = layer_mse(bricks, io)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            progress.advance()
            n = len(io[0][0])
            total, count = total + loss.item() / len(io) * n, count + n
        per_epoch.append(total / max(count, 1))
    return per_epoch[0], per_epoch[-1]


def brick_names(names, domain: str, positions=None) -> list[str]:
    """The wire names of ``domain``'s BRICKs (at ``positions``; all when None)."""
    prefix = f"bricks.{domain}."
    return [n for n in names if n.startswith(prefix)
            and (positions is None or int(n.split(".")[2]) in positions)]


def initial_bricks(state: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """A1, A2 ~ U(-1/sqrt(d), 1/sqrt(d)), B1 = B2 = 0, from their own seeded generator."""
    gen = torch.Generator().manual_seed(seed + BRICK_SEED)
    out = {}
    for name in sorted(n for n in state if n.startswith("bricks.")):
        t = torch.zeros(state[name].shape)
        if name.endswith(("A1", "A2")):
            bound = 1.0 / math.sqrt(t.shape[1])
            t.uniform_(-bound, bound, generator=gen)
        out[name] = t.numpy()
    return out


class FedBRICKRecipe(ClientRecipe):
    """BRICKs on the model; the two-stage local training (Eq. 21-24)."""

    gradient_bounds: dict[str, float] = {}  # two stages: more steps than one local round

    tensor_formulas = {"bricks.": "FedBRICK BRICK E(x) = x * softmax(B1 A1 x) + B2 A2 x + x "
                                  "standing in for block <position> of domain <domain>"}

    def cache_key(self):
        return (self.cfg.own.fedbrick_rank, tuple(brick_domains(self.cfg)))

    def extend(self, model):
        d, r = model.head.in_features, self.cfg.own.fedbrick_rank  # block width = head input
        add_trained_module(model, "bricks", nn.ModuleDict({
            c: nn.ModuleDict({str(l): Brick(d, r) for l in range(model.num_blocks)})
            for c in brick_domains(self.cfg)}))
        return model

    @property
    def domain(self) -> str:
        return self.round_config["brick-domain"]

    def trainables(self, model, plan):
        return {n: p for n, p in super().trainables(model, plan).items()
                if not n.startswith("bricks.") or n.startswith(f"bricks.{self.domain}.")}

    def begin(self, params, context):
        self._params = params
        self._global = {n: p.detach().clone() for n, p in params.items()}

    def _tether(self, names) -> torch.Tensor:
        return sum((self._params[n] - self._global[n]).pow(2).sum() for n in names)

    def loss(self, model, plan, inputs, labels):
        """Stage I (Eq. 21)."""
        logits, _ = forward_with_bricks(model, plan, model.bricks[self.domain], inputs)
        blocks = [n for n in self._params if block_of(n) is not None]
        missing = brick_names(self._params, self.domain,
                              set(range(model.num_blocks)) - set(plan))
        return (nn.functional.cross_entropy(logits.float(), labels)
                + self.cfg.own.fedbrick_lambda_w * self._tether(blocks)
                + self.cfg.own.fedbrick_lambda_theta * self._tether(missing))

    def stage2_loss(self, model, plan, inputs, labels, alpha: float):
        """Stage II (Eq. 23-24)."""
        logits, pairs = forward_with_bricks(model, plan, model.bricks[self.domain], inputs,
                                            alpha)
        distill = sum(nn.functional.mse_loss(e.float(), f.float()) for e, f in pairs)
        return nn.functional.cross_entropy(logits.float(), labels) \
            + self.cfg.own.fedbrick_lambda_d / len(plan) * distill

    def fit(self, model, plan, params, examples, seed, device, loss_fn, server_round):
        """Stage I on ``loss_fn`` (this recipe's ``loss`` plus any FedProx/FedDyn term), then
        stage II."""
        retained = set(brick_names(params, self.domain, set(plan)))
        stage1 = [p for n, p in params.items() if n not in retained]
        stage2 = [params[n] for n in sorted(retained)]
        training = self.cfg.training
        loss = train_local(model, stage1, examples, training, seed=seed, device=device,
                           loss_fn=loss_fn)
        stage2_training = replace(training, local_epochs=self.cfg.own.fedbrick_stage2_epochs)
        steps = self.cfg.own.fedbrick_stage2_steps  # "only a few local steps": a per-epoch cap
        if steps:
            examples = replace(examples, max_batches=min(steps, examples.max_batches or steps))
        total = stage2_training.local_epochs * examples.num_batches(training.batch_size)
        steps = itertools.count()  # train_local calls the loss once per optimizer step
        train_local(model, stage2, examples, stage2_training, seed=seed + 1, device=device,
                    loss_fn=lambda x, y: self.stage2_loss(model, plan, x, y,
                                                          anneal(next(steps), total)))
        return loss


class FedBRICK(FedRA):
    name = "fedbrick"
    private_aggregation = False  # its server distillation reads the aggregate's inputs (proxy data)

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.domains = brick_domains(cfg)
        self.domain_of = {}
        for c in self.clients:
            self.admit(c)
        if not any(n.startswith("bricks.") for n in self.state):
            raise ConfigError("FedBRICK: the model has no BRICKs (method 'fedbrick' needs its "
                              "client recipe's extended model)")
        self.state |= initial_bricks(self.state, cfg.seed)
        self._proxy = None

    def admit(self, client):
        domain = ALL if self.domains == [ALL] else client.group
        if domain not in self.domains:
            raise ConfigError(f"FedBRICK: client {client.partition_id} reports group "
                              f"{client.group!r}, not one of the domains {self.domains} (key "
                              "'domains')")
        self.domain_of[client.partition_id] = domain

    # -- payload: planned blocks + head + the client's domain's BRICKs ----------------------
    def _payload(self, domain: str, plan) -> list[str]:
        return [n for n in names_for_plan(self.state, plan) if not n.startswith("bricks.")] \
            + brick_names(self.state, domain)

    def client_payload(self, client, plan):
        return self._payload(self.domain_of[client.partition_id], plan)

    def train_config(self, client, plan):
        return {"brick-domain": self.domain_of[client.partition_id]}

    def begin_round(self, server_round):
        started = time.perf_counter()
        mse = self.server_distill(self.state, server_round)  # step 1
        return {"server-distill-seconds": time.perf_counter() - started,
                "server-distill-mse": mse}

    def overheads(self, entry) -> dict:
        """Per client this round: BRICK parameters it stores, and their share of its model."""
        model = self.model
        if model is None:  # used outside run_federation: no model to count
            return {}
        shared = sum(p.numel() for m in (model.stem, model.neck, model.head)
                     for p in m.parameters())
        per_block = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
        params, share = {}, {}
        for pid, plan in entry.plans.items():
            n = int(sum(self.state[name].size
                        for name in brick_names(self.state, self.domain_of[pid])))
            params[str(pid)] = n
            share[str(pid)] = n / (shared + sum(per_block[l] for l in plan))
        return {"brick-params": params, "brick-share": share}

    # -- aggregation: masked mean (step 5) ------------------------------------------------
    def aggregate(self, updates):
        new = self.combine(updates)
        entry = self.history[-1]
        sent = self.payload_names(entry)
        entry.method_metrics |= {
            "brick-bytes-down": int(sum(self.state[n].nbytes for names in sent.values()
                                        for n in names if n.startswith("bricks."))),
            **self.overheads(entry),
            "brick-bytes-up": int(sum(v.nbytes for u in updates for n, v in u.tensors.items()
                                      if n.startswith("bricks.")))}
        return self.server_objective(updates, new)

    def proxy_sets(self) -> dict:
        """Domain -> the server's proxy examples of that domain."""
        if self._proxy is None:
            splits = run_splits(self.cfg)
            proxy = splits.train.subset(proxy_indices(self.cfg.data.proxy_fraction, splits))
            if self.domains == [ALL]:
                self._proxy = {ALL: proxy} if len(proxy) else {}
            else:
                index = {name: d for d, name in enumerate(splits.domain_names)}
                self._proxy = {c: proxy.subset(np.flatnonzero(proxy.domains.numpy() == index[c]))
                               for c in self.domains}
        return self._proxy

    def server_distill(self, state: dict[str, np.ndarray], round_: int) -> dict:
        """Eq. 20 in place on ``state``'s BRICKs; domain -> [first, last] epoch's MSE."""
        epochs = self.cfg.own.fedbrick_server_epochs
        if not epochs or self.cfg.data.proxy_fraction <= 0:
            return {}
        if self.model is None:
            raise RuntimeError("FedBRICK: the server model is not set (run_federation sets it)")
        model = self.model
        load_state(model, state)
        device = next(model.parameters()).device
        out = {}
        for i, (domain, data) in enumerate(self.proxy_sets().items()):
            bricks = model.bricks[domain]
            seed = self.cfg.seed * 1_000_003 + round_ * 1009 + 500 + i
            own = self.cfg.own
            first, last = distill_bricks(model, bricks, data, epochs, own.fedbrick_server_lr,
                                         self.cfg.training.batch_size, seed, device,
                                         own.fedbrick_server_optimizer,
                                         what=f"fedbrick round {round_} domain {domain}: "
                                              "server distillation")
            out[domain] = [first, last]
            for name, p in bricks.named_parameters():
                state[f"bricks.{domain}.{name}"] = p.detach().cpu().numpy().astype(np.float32)
        return out


@dataclass(frozen=True)
class FedBRICKConfig(ConfigPart):
    """FedBRICK's own keys (its paper's open choices are keys here)."""
    fedbrick_rank: int = config_key(8, minimum=1, help=
        "FedBRICK: rank r of a BRICK's two low-rank paths (4rd parameters per BRICK)")
    fedbrick_lambda_w: float = config_key(0.01, minimum=0, help=
        "FedBRICK stage I: weight of ||w - w_global||^2 on the retained blocks' trainables (Eq. "
        "21)")
    fedbrick_lambda_theta: float = config_key(0.005, minimum=0, help=
        "FedBRICK stage I: weight of ||theta - theta_global||^2 on the missing positions' BRICKs "
        "(Eq. 21)")
    fedbrick_lambda_d: float = config_key(0.01, minimum=0, help=
        "FedBRICK stage II: weight of the BRICK-vs-block distillation term (Eq. 24)")
    fedbrick_stage2_epochs: int = config_key(1, minimum=1, help=
        "FedBRICK: local epochs of stage II (stage I runs 'local-epochs')")
    fedbrick_server_epochs: int = config_key(10, minimum=0, help=
        "FedBRICK: epochs of server-side BRICK distillation on the proxy set per round (Eq. 20; 0 "
        "= none)")
    fedbrick_stage2_steps: int = config_key(0, minimum=0, help=
        "FedBRICK: cap each stage-II epoch at this many batches (the paper's 'only a few local "
        "steps'; 0 = whole epochs, its 'one local epoch ... in both stages')")
    fedbrick_server_optimizer: str = config_key("adam", choices=('adam', 'sgd'), help=
        "FedBRICK: optimizer of the server-side BRICK distillation (the paper gives only its "
        "'server learning rate of 1e-4'; Adam is ours, plain SGD the alternative)")
    fedbrick_server_lr: float = config_key(0.0001, minimum=0, help=
        "FedBRICK: Adam learning rate of the server-side distillation (paper: server learning rate"
        " 1e-4)")


register_method("fedbrick", strategy=FedBRICK, recipe=FedBRICKRecipe, holdout="proxy",
                config=FedBRICKConfig)
