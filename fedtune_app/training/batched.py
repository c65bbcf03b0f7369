"""The batched client engine: the clients of a round trained together over the shared frozen
backbone, each getting exactly its own gradient.

Every client of a round runs the same frozen backbone; only its small trainable tensors (LoRA
factors, bottleneck adapters, the head) differ. A ``Cohort`` therefore

- concatenates the clients' batches of each local step into one batch;
- runs every frozen module once over the rows of the clients that hold it: the stem and neck on
  every row, block ``j`` on the rows of the clients whose plan holds ``j`` (FedRA's random
  subsets: each client's rows are a view of the last block output that held them, and a block
  takes its holders' rows concatenated; the blocks run in ascending order, so each client sees
  its own plan's blocks in its own order);
- stacks, per Linear layer holding a trainable tensor, the clients' weights into one tensor of
  shape (clients, out, in) and applies each client's weight to its own rows (``torch.bmm`` when
  the clients' slices are equally long, one matmul per client otherwise); a rank-heterogeneous
  client's LoRA is already rank R with zero components beyond its rank (``RankRecipe.assign``),
  which is exactly the zero-padding to the largest rank;
- sums the clients' mean losses: client c's tensors only touch client c's rows, so the gradient
  of the sum with respect to them is the gradient of client c's own loss;
- clips each client's gradient by its own norm and steps one optimizer over the stacks (SGD and
  AdamW are elementwise, so each client's slice follows its own update, state included);
- draws each client's LoRA dropout masks from its own generator seeded as the sequential path
  seeds torch's global one, in the same order (its blocks ascending), so the masks are equal;
- lets a client with fewer steps drop out of the batch when its batches run out: its tensors are
  taken at that moment (after its last step) and its slices are never read again, which is the
  same as freezing its parameters and optimizer state.

What a client receives and sends back is unchanged: the caller prepares each client with its
recipe's own ``configure``/``assign``/``begin`` on the shared model (``Cohort.add`` takes a copy
of the tensors it set), and after ``train`` loads each client's trained tensors back into the
model (``Cohort.load``) to build its reply with the recipe's own ``trained``/``reply``.

Where it runs (run-config key ``client-engine = "batched"``): the in-process runner hands a
round's train messages to ``apps.client.handle_train_cohort`` at once; under `flwr run` the
ServerApp's ``apps.cohort_grid.CohortGrid`` sends them to one simulated node as one message.

Only the plain local step is batched. ``not_batchable`` is the one place that says which
methods' clients fall back to the sequential path: a recipe with its own loss or training loop
(DepthFL's exits, FedBRICK's stages, FedMD's digest, HetLoRA's pruning term, HeteroTune's
adapters, pFedLoRA's phases), a FedProx/FedDyn term, full fine-tuning. ``Cohort`` refuses
(``NotBatchable``) a model its forward cannot split by rows: text families, whose blocks take a
per-row attention mask, and dropout other than LoRA's, which draws from torch's global
generator. Either way the clients train as before, one after another, and the log says why
(and each reply's ``trained-batched`` metric). Any other error of the engine is each of its
clients' error reply: never retried on the sequential path (``apps.client.train_cohort``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from fedtune_app.config import RunConfig, TrainingConfig
from fedtune_app.data.splits import Examples
from fedtune_app.model.adapters import PEFT_ADAPTER, trainable_parameters
from fedtune_app.model.backbones import LayeredModel
from fedtune_app.training.local import autocast, make_optimizer, to_device
from fedtune_app.training.recipes import ClientRecipe

ENGINES = ("sequential", "batched")
_BLOCK_PREFIX = "blocks."


class NotBatchable(Exception):
    """Why a client (or a model) trains on the sequential path instead."""


def not_batchable(cfg: RunConfig, recipe: ClientRecipe) -> str | None:
    """Why this client's local step cannot join a cohort (None: it can). The one place that
    decides which methods the batched engine covers: those whose client step is plain local
    training of its trainable tensors, i.e. whose recipe keeps ``ClientRecipe``'s loss and
    training loop (FedRA, AllLarge, AllSmall, InclusiveFL's clients, FlexiFed, Homo, FedDF,
    whose distillation is the server's, FedIT, FLoRA, FlexLoRA, FedEx-LoRA, FFA-LoRA,
    FedSA-LoRA; tests/test_batched_engine.py compares each with the sequential engine)."""
    kind = type(recipe)
    if kind.loss is not ClientRecipe.loss or kind.fit is not ClientRecipe.fit:
        return f"method {cfg.method!r} has its own local loss or training loop"
    if cfg.objective[0] != "plain":
        return f"local objective {cfg.objective[0]!r} adds a term per client"
    if cfg.adapter.client_trains == "full":
        return "full fine-tuning trains the shared backbone itself"
    return None


@dataclass
class _Client:
    plan: tuple[int, ...]
    examples: Examples
    seed: int
    trained: set[str]  # model parameter names this client trains
    values: dict[str, torch.Tensor]  # model parameter name -> its value when it was added


class _Layout:
    """Which clients' rows the module being run sees: cohort indices and row counts, in order."""

    def __init__(self):
        self.clients: list[int] = []
        self.sizes: list[int] = []
        self.index: torch.Tensor | None = None  # of ``clients``; None: every client, in order

    def set(self, clients: list[int], sizes: list[int], index: torch.Tensor | None) -> None:
        self.clients, self.sizes, self.index = clients, sizes, index


class Cohort:
    """Clients of one round sharing ``model`` (one backbone, one method); see the module doc."""

    def __init__(self, model: LayeredModel, training: TrainingConfig, device: torch.device):
        if model.family != "timm":
            raise NotBatchable(f"the {model.family!r} family's blocks take a per-row context "
                               "(attention masks) the cohort forward does not split")
        self.model, self.training, self.device = model, training, device
        named = dict(_model_names(model, trainable_parameters(model)))
        # every Linear holding one of the method's tensors gets one weight per client (frozen
        # ones too: FFA-LoRA's A, truncated to each client's rank)
        self.linears: dict[str, nn.Linear] = {
            name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)
            and any(f"{name}.{p}" in named for p, _ in m.named_parameters(recurse=False))}
        covered = {f"{name}.{p}" for name, m in self.linears.items()
                   for p, _ in m.named_parameters(recurse=False)}
        outside = {n: p for n, p in named.items() if n not in covered}
        if any(p.requires_grad for p in outside.values()):
            raise NotBatchable(f"trainable tensors outside a Linear layer: "
                               f"{sorted(n for n, p in outside.items() if p.requires_grad)[:3]}")
        # frozen tensors outside them (the merged ``lora_delta``): the server sends every client
        # the same, so the model's one copy serves them all (``add`` checks)
        self.shared = outside
        self.tensors = {f"{name}.{p}": t for name, m in self.linears.items()
                        for p, t in m.named_parameters(recurse=False)}
        self.names = {id(p): n for n, p in model.named_parameters()}
        # peft LoRA layers run as one function (base, then each client's B A on its rows)
        # instead of three module calls each: same operations, less Python per step
        self.loras = {name: m for name, m in model.named_modules() if _plain_lora(m)}
        self.dropouts: dict[str, nn.Dropout] = {}
        for name, m in model.named_modules():
            rate = getattr(m, "p", getattr(m, "drop_prob", 0.0))
            if isinstance(m, nn.Dropout) and ".lora_dropout." in f".{name}.":
                self.dropouts[name] = m
            elif ("Dropout" in type(m).__name__ or "DropPath" in type(m).__name__) and rate:
                raise NotBatchable(f"{name} ({type(m).__name__}, p={rate}) draws from torch's "
                                   "global generator")
        self.clients: list[_Client] = []
        self.layout = _Layout()
        self._indices: dict[tuple, torch.Tensor] = {}  # clients -> their index tensor

    # ---- building the cohort -------------------------------------------------------------

    def add(self, plan, params: dict[str, nn.Parameter], examples: Examples, seed: int) -> int:
        """A client, prepared on the shared model (its recipe's ``assign``/``begin`` done):
        its plan, the parameters it trains (``recipe.trainables``), its data and seed. The
        model's per-client tensors are copied now; returns the client's index."""
        trained = {self.names[id(p)] for p in params.values()}
        values = {n: t.detach().clone() for n, t in self.tensors.items()}
        for name, param in self.shared.items():
            first = self.clients[0].values[name] if self.clients else None
            if first is not None and not torch.equal(first, param.detach()):
                raise NotBatchable(f"{name} (frozen) differs between the clients")
            values[name] = param.detach().clone()
        self.clients.append(_Client(tuple(plan), examples, seed, trained, values))
        return len(self.clients) - 1

    def load(self, index: int) -> None:
        """Client ``index``'s tensors (trained, after ``train``) into the shared model."""
        values = self.clients[index].values
        with torch.no_grad():
            for name, t in self.tensors.items():
                t.copy_(values[name])

    # ---- training --------------------------------------------------------------------------

    def train(self) -> list[float]:
        """Every client's local training at once; returns each client's mean training loss
        and leaves its trained tensors for ``load``."""
        clients, training = self.clients, self.training
        stacks = self._stacks()
        trained = [t for t in stacks.values() if t.requires_grad]
        if not trained:
            raise NotBatchable("the clients train no tensor")
        optimizer = make_optimizer(trained, training, foreach=True)  # a few calls per step
        generators = [torch.Generator(self.device).manual_seed(c.seed) for c in clients]
        batches = [_batches(c.examples, training, c.seed) for c in clients]
        totals = [torch.zeros((), device=self.device) for _ in clients]
        counts = [0] * len(clients)
        active = list(range(len(clients)))
        self.model.train()
        with self._per_client(stacks, generators):
            while active:
                step = [(i, next(batches[i], None)) for i in active]
                for i, batch in step:
                    if batch is None:  # out of batches: its tensors as after its last step
                        self._take(i, stacks)
                step = [(i, b) for i, b in step if b is not None]
                active = [i for i, _ in step]
                if not active:
                    break
                sizes = [len(b[1]) for _, b in step]
                inputs = to_device(_cat([b[0] for _, b in step]), self.device)
                labels = torch.cat([b[1] for _, b in step]).to(self.device)
                with autocast(training.precision, self.device):
                    logits = self._forward(inputs, active, sizes)
                losses = [ce.mean() for ce in nn.functional.cross_entropy(
                    logits.float(), labels, reduction="none").split(sizes)]
                optimizer.zero_grad(set_to_none=True)
                torch.stack(losses).sum().backward()
                if training.grad_clip > 0:
                    _clip_per_client(trained, training.grad_clip)
                optimizer.step()
                for i, loss, n in zip(active, losses, sizes):
                    totals[i] += loss.detach() * n
                    counts[i] += n
        self.model.eval()
        return [t.item() / max(n, 1) for t, n in zip(totals, counts)]

    def _stacks(self) -> dict[str, torch.Tensor]:
        """Model parameter name -> (clients, *shape), a leaf that requires grad when a client
        trains it. A tensor trained by some of the clients holding it and used frozen by others
        would need a mask per client: no recipe does that, so it is refused."""
        stacks = {}
        for name in self.clients[0].values:
            if name in self.shared:
                continue
            holders = [c for c in self.clients if _holds(c.plan, name)]
            training = {name in c.trained for c in holders}
            if len(training) > 1:
                raise NotBatchable(f"{name} is trained by some clients and frozen for others")
            stack = torch.stack([c.values[name] for c in self.clients]).to(self.device)
            stacks[name] = stack.requires_grad_(training == {True})
        return stacks

    def _take(self, index: int, stacks: dict[str, torch.Tensor]) -> None:
        client = self.clients[index]
        client.values = {n: t[index].detach().clone() for n, t in stacks.items()}

    def _forward(self, inputs, active: list[int], sizes: list[int]) -> torch.Tensor:
        """``LayeredModel.forward`` over the concatenated batch, each block on its holders' rows.

        Each client's rows are a view of the last output that held them; a block whose holders
        are those of the block before takes that output as it is, another takes its holders'
        rows concatenated (only theirs: the others' rows are neither copied nor written back)."""
        model = self.model
        everyone = tuple(range(len(active)))
        x, ctx = model.embed(inputs)
        rows = dict(enumerate(x.split(sizes)))  # position in ``active`` -> its current rows
        last = (everyone, x)  # holders of the last output, and that output
        for j in sorted({j for i in active for j in self.clients[i].plan}):
            held = tuple(k for k in everyone if j in self.clients[active[k]].plan)
            inp = last[1] if held == last[0] else torch.cat([rows[k] for k in held])
            self._lay_out(held, active, sizes)
            out = model.run_block(model.blocks[j], inp, ctx)
            rows.update(zip(held, out.split([sizes[k] for k in held])))
            last = (held, out)
        x = last[1] if last[0] == everyone else torch.cat([rows[k] for k in everyone])
        self._lay_out(everyone, active, sizes)
        return model.classify(x, ctx)

    def _lay_out(self, held: tuple, active: list[int], sizes: list[int]) -> None:
        """The layout of the rows of the clients at positions ``held`` of ``active``."""
        clients = [active[k] for k in held]
        index = None
        if len(clients) != len(self.clients):
            key = tuple(clients)
            if key not in self._indices:
                self._indices[key] = torch.tensor(clients, device=self.device)
            index = self._indices[key]
        self.layout.set(clients, [sizes[k] for k in held], index)

    # ---- the per-client modules --------------------------------------------------------------

    def _per_client(self, stacks, generators):
        """While training, each stacked Linear, LoRA layer and LoRA dropout computes per client
        (an instance ``forward`` shadows the class's; removed again on exit)."""
        cohort = self
        inside_lora = {f"{name}.{part}.{PEFT_ADAPTER}" for name in self.loras
                       for part in ("lora_A", "lora_B")}
        linears = {n: m for n, m in self.linears.items() if n not in inside_lora}

        class Patched:
            def __enter__(self):
                for name, m in linears.items():
                    m.forward = functools.partial(cohort._linear, stacks[f"{name}.weight"],
                                                  stacks.get(f"{name}.bias"))
                for name, m in cohort.loras.items():
                    a, b = (stacks[f"{name}.{part}.{PEFT_ADAPTER}.weight"]
                            for part in ("lora_A", "lora_B"))
                    m.forward = functools.partial(cohort._lora, m, a, b, generators)
                for m in cohort.dropouts.values():
                    m.forward = functools.partial(cohort._dropout, m, generators)

            def __exit__(self, *exc):
                for m in [*linears.values(), *cohort.loras.values(), *cohort.dropouts.values()]:
                    del m.forward

        return Patched()

    def _select(self, stack: torch.Tensor) -> torch.Tensor:
        index = self.layout.index
        return stack if index is None else stack.index_select(0, index)

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor):
        w, sizes = self._select(weight), self.layout.sizes
        b = None if bias is None else self._select(bias)
        if len(set(sizes)) == 1:  # equal slices: one batched matmul
            xs = x.reshape(len(sizes), -1, x.shape[-1])
            y = (torch.bmm(xs, w.transpose(1, 2)) if b is None
                 else torch.baddbmm(b.unsqueeze(1), xs, w.transpose(1, 2)))
            return y.reshape(*x.shape[:-1], w.shape[1])
        return torch.cat([nn.functional.linear(part, w[k], None if b is None else b[k])
                          for k, part in enumerate(x.split(sizes))])

    def _lora(self, module, a_stack, b_stack, generators, x: torch.Tensor) -> torch.Tensor:
        """peft's ``lora.Linear.forward`` (vanilla LoRA, one adapter), each client's factors on
        its rows: base(x) + B(A(dropout(x))) * scaling, in that order."""
        result = module.base_layer(x)
        h = self._dropout(module.lora_dropout[PEFT_ADAPTER], generators, x)
        a, b, sizes = self._select(a_stack), self._select(b_stack), self.layout.sizes
        if len(set(sizes)) == 1:
            hs = h.reshape(len(sizes), -1, h.shape[-1])
            lora = torch.bmm(torch.bmm(hs, a.transpose(1, 2)), b.transpose(1, 2))
            lora = lora.reshape(*x.shape[:-1], b.shape[1])
        else:
            lora = torch.cat([nn.functional.linear(nn.functional.linear(part, a[k]), b[k])
                              for k, part in enumerate(h.split(sizes))])
        scaling = module.scaling[PEFT_ADAPTER]
        if scaling != 1.0:  # a product by 1.0 (alpha = r) changes no bit: skip it
            lora = lora * scaling
        return (result + lora).to(result.dtype)

    def _dropout(self, module: nn.Module, generators, x: torch.Tensor) -> torch.Tensor:
        """torch's CPU dropout, noise = bernoulli(1 - p) / (1 - p), drawn per client from its
        own generator (the fused CUDA kernel draws differently: there masks are per client but
        not the sequential path's)."""
        p = getattr(module, "p", 0.0)  # peft's LoRA without dropout: nn.Identity
        if not module.training or p == 0:
            return x
        if p == 1:
            return x * 0.0
        parts = []
        for i, part in zip(self.layout.clients, x.split(self.layout.sizes)):
            noise = torch.empty_like(part).bernoulli_(1 - p, generator=generators[i])
            parts.append(part * noise.div_(1 - p))
        return torch.cat(parts)


def _plain_lora(module: nn.Module) -> bool:
    """A peft LoRA layer in its plain state: one adapter, not merged, no variant (DoRA), no
    bias on B, over a Linear."""
    return (isinstance(getattr(module, "base_layer", None), nn.Linear)
            and isinstance(getattr(module, "lora_A", None), nn.ModuleDict)
            and list(module.lora_A) == [PEFT_ADAPTER] and not module.disable_adapters
            and not module.merged and not getattr(module, "lora_variant", {})
            and list(module.active_adapters) == [PEFT_ADAPTER]
            and module.lora_B[PEFT_ADAPTER].bias is None)


def _holds(plan, name: str) -> bool:
    """Whether a client with ``plan`` holds the model parameter ``name`` (shared parts: yes)."""
    if not name.startswith(_BLOCK_PREFIX):
        return True
    return int(name.split(".")[1]) in plan


def _model_names(model: nn.Module, params: dict[str, nn.Parameter]):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [(by_id[id(p)], p) for p in params.values()]


def _batches(examples: Examples, training: TrainingConfig, seed: int):
    """The client's batches, as ``train_local`` draws them (its own generator, every epoch)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(training.local_epochs):
        yield from examples.batches(training.batch_size, generator=gen)


def _cat(parts):
    if isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)


def _clip_per_client(stacks: list[torch.Tensor], max_norm: float) -> None:
    """``clip_grad_norm_`` for each client on its own slices: the norm over its tensors,
    coefficient max_norm / (norm + 1e-6) capped at 1, applied as torch applies it."""
    grads = [t.grad for t in stacks if t.grad is not None]
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads])
    total = torch.linalg.vector_norm(norms, 2, dim=0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if bool((coef == 1.0).all()):  # a product by 1.0 changes no bit: skip it
        return
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
