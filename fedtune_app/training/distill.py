"""The distillation steps FedMD and FedDF share, on the public set (``splits.public_split``).

Every node and the server load the same data, so the public inputs never travel; only scores on
them do (FedMD). Labels of the public set are never used.

FedMD's digest reuses ``train_local`` (the clients' optimizer, clipping, seeded shuffling);
FedDF's server distillation runs ``distill_steps`` (its paper's Adam, step budget and early
stopping). The public examples are re-labelled with their own index, so a loss sees which
targets belong to its batch.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch
from torch import nn

from fedtune_app.config import TrainingConfig
from fedtune_app.data.splits import Examples
from fedtune_app.model.progress import Progress


def indexed(examples: Examples) -> Examples:
    """The same inputs labelled 0..n-1 (which distillation targets belong to a batch)."""
    return Examples(examples.inputs, torch.arange(len(examples)))


def consensus(scores: list[np.ndarray]) -> np.ndarray:
    """FedMD's aggregate: the plain mean of the parties' class scores, f~ = 1/m sum_k f_k."""
    return np.mean(np.stack([s.astype(np.float64) for s in scores]), axis=0).astype(np.float32)


def digest_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """FedMD's digest: mean absolute error between the model's class scores (logits) and the
    consensus (the FedMD code trains with Keras' mean_absolute_error on logits)."""
    return (logits.float() - target).abs().mean()


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """FedDF's distillation loss: T^2 KL(softmax(teacher/T) || softmax(student/T)), batch mean."""
    log_p = nn.functional.log_softmax(teacher.float() / temperature, -1)
    log_q = nn.functional.log_softmax(student.float() / temperature, -1)
    return temperature ** 2 * (log_p.exp() * (log_p - log_q)).sum(-1).mean()


@torch.inference_mode()
def scores_on(model, plan, public: Examples, batch_size: int, device) -> np.ndarray:
    """Class scores (logits) of ``model`` on every public example, in order."""
    model.eval()
    out = [model(inputs.to(device) if not isinstance(inputs, dict)
                 else {k: v.to(device) for k, v in inputs.items()}, plan).float().cpu()
           for inputs, _ in public.batches(batch_size)]
    return torch.cat(out).numpy()


def distill(model, plan, params: list[nn.Parameter], public: Examples, targets: np.ndarray,
            loss, training: TrainingConfig, epochs: int, lr: float, seed: int,
            device) -> float:
    """Train ``params`` so that the model's logits on ``public`` approach ``targets`` under
    ``loss(logits, target_logits)``, for ``epochs`` epochs of SGD at ``lr`` (its momentum, weight
    decay and clipping those of ``training``)."""
    from fedtune_app.training.local import train_local

    target = torch.as_tensor(targets, dtype=torch.float32, device=device)
    # SGD whatever the run's local optimizer: the rate is an SGD rate (FedMD's digest)
    sgd = dataclasses.replace(training, local_epochs=epochs, lr=lr, optimizer="sgd")
    return train_local(model, params, indexed(public), sgd, seed=seed, device=device,
                       loss_fn=lambda inputs, idx: loss(model(inputs, plan), target[idx]))


def distill_steps(model, plan, params: list[nn.Parameter], public: Examples, targets: np.ndarray,
                  loss, steps: int, lr: float, batch_size: int, seed: int, device,
                  validate=None, eval_every: int = 100, patience: int = 1000,
                  what: str = "distillation") -> int:
    """FedDF's server distillation: Adam at ``lr`` with cosine annealing over ``steps``
    mini-batches of ``public`` (reshuffled each pass). With ``validate`` (-> accuracy), the
    model is validated first and every ``eval_every`` steps; once ``patience`` steps have
    passed since the best accuracy, it stops, and the best parameters are kept (the start's
    when nothing beat it; the last step is validated too when it falls between checks).
    Returns the number of steps taken. A run of more than a few seconds
    logs its progress (``what``: the phase's name in those lines)."""
    target = torch.as_tensor(targets, dtype=torch.float32, device=device)
    optimizer = torch.optim.Adam(params, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    gen = torch.Generator().manual_seed(seed)
    data = indexed(public)

    def passes():
        while True:
            yield from data.batches(batch_size, generator=gen)

    def best_so_far(step: int):
        model.eval()
        accuracy = validate()
        model.train()
        return accuracy, step, [p.detach().clone() for p in params]

    best = best_so_far(0) if validate else None  # (accuracy, step, parameters)
    taken = 0
    progress = Progress(what, steps)  # ETA to the step budget (early stopping may end sooner)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # dropout draws from torch's global RNG
        model.train()
        for inputs, idx in itertools.islice(passes(), steps):
            inputs = inputs.to(device) if not isinstance(inputs, dict) \
                else {k: v.to(device) for k, v in inputs.items()}
            value = loss(model(inputs, plan), target[idx.to(device)]).float()
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            schedule.step()
            taken += 1
            progress.advance()
            if validate and taken % eval_every == 0:
                now = best_so_far(taken)
                if now[0] > best[0]:
                    best = now
                elif taken - best[1] >= patience:
                    break
    if validate and taken % eval_every:  # the last steps, validated like the others
        now = best_so_far(taken)
        best = now if now[0] > best[0] else best
    model.eval()
    if validate:
        with torch.no_grad():
            for p, kept in zip(params, best[2]):
                p.copy_(kept)
    return taken
