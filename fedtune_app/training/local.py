"""Local training of a sub-network and evaluation of the global model."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from torch import nn

from fedtune_app.config import ConfigError, RunConfig, TrainingConfig
from fedtune_app.data.splits import Examples
from fedtune_app.model.backbones import LayeredModel


def pick_device(choice: str = "auto") -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run-config key 'device' = 'cuda': this machine has no CUDA GPU (the "
                          "LLaMA presets need one); allowed here: auto, cpu")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def check_precision(precision: str, device: torch.device) -> None:
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("run-config key 'precision' = 'bf16': this GPU has no bfloat16 "
                          "support (needs compute capability >= 8.0, e.g. A100/H100); "
                          "allowed here: fp32")


def autocast(precision: str, device: torch.device):
    """bf16: matmuls and convolutions run in bfloat16 on CUDA and on the CPU (torch's autocast
    op lists); parameters, gradients and the optimizer stay float32, so no loss scaling is
    needed. fp32: nothing changes."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def to_device(inputs, device):
    if isinstance(inputs, dict):
        return {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
    return inputs.to(device, non_blocking=True)


def round_lr(cfg: RunConfig, server_round: int) -> float:
    """The local learning rate of round t (1-based) of T = ``num-server-rounds``: a linear
    warm-up lr * t / W over the first W = ``lr-warmup-rounds`` rounds, then ``lr-schedule``:
    constant lr, or cosine lr (1 + cos(pi (t - W - 1) / (T - W))) / 2 (lr in round W + 1,
    approaching 0 after round T). The schedule runs over rounds, not local steps: every client
    of a round trains at the same rate, whatever its data size."""
    lr, warmup = cfg.training.lr, cfg.training.lr_warmup_rounds
    total = cfg.federation.num_server_rounds
    if server_round <= warmup:
        return lr * server_round / warmup
    if cfg.training.lr_schedule == "cosine":
        return lr * (1 + math.cos(math.pi * (server_round - warmup - 1) / (total - warmup))) / 2
    return lr


def make_optimizer(params: list[nn.Parameter], training: TrainingConfig,
                   foreach: bool | None = None) -> torch.optim.Optimizer:
    """``optimizer`` over ``params`` at ``lr``: SGD (momentum, L2 weight decay) or AdamW
    (betas, eps, decoupled weight decay). ``foreach``: torch's choice of implementation (None:
    its default; the same arithmetic either way, one call over all tensors or one per tensor)."""
    if training.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=training.lr, betas=(training.adam_beta1,
                                 training.adam_beta2), eps=training.adam_eps,
                                 weight_decay=training.weight_decay, foreach=foreach)
    return torch.optim.SGD(params, lr=training.lr, momentum=training.momentum,
                           weight_decay=training.weight_decay, foreach=foreach)


def train_local(model: LayeredModel, params: list[nn.Parameter], data: Examples,
                training: TrainingConfig, seed: int, device: torch.device,
                loss_fn=None) -> float:
    """``make_optimizer`` (SGD or AdamW), grad-norm clip, on ``params`` of the (sub-)network.
    ``loss_fn(inputs, labels)`` is the local objective (default: cross-entropy of the model's
    logits; a method's recipe may add terms). Returns the mean training loss. A fresh optimizer
    each round (Adam's moments included): FedRA's clients keep no state between rounds."""
    if loss_fn is None:
        def loss_fn(inputs, labels):
            return nn.functional.cross_entropy(model(inputs).float(), labels)
    # dropout (peft LoRA's included) draws from torch's global RNG: seed it for this round
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model.train()
        optimizer = make_optimizer(params, training)
        gen = torch.Generator().manual_seed(seed)
        # the running loss stays on the device: a .item() per step would make the CPU wait
        # for the GPU every step instead of queueing the next batch
        total, count = torch.zeros((), device=device), 0
        for _ in range(training.local_epochs):
            for inputs, labels in data.batches(training.batch_size, generator=gen):
                inputs, labels = to_device(inputs, device), labels.to(device)
                with autocast(training.precision, device):
                    loss = loss_fn(inputs, labels).float()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if training.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(params, training.grad_clip)
                optimizer.step()
                total += loss.detach() * len(labels)
                count += len(labels)
    model.eval()
    return total.item() / max(count, 1)


@torch.inference_mode()
def predict_outputs(model: LayeredModel, plan, data: Examples, batch_size: int,
                    device: torch.device, precision: str = "fp32",
                    forward=None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per output of ``forward(model, plan, inputs) -> {name: logits}`` (default: the model's
    one output, named ""): per-example (predicted class, cross-entropy loss)."""
    forward = forward or (lambda m, p, x: {"": m(x, p)})
    model.eval()
    preds, losses = {}, {}
    for inputs, labels in data.batches(batch_size):
        labels = labels.to(device)
        with autocast(precision, device):
            outputs = forward(model, plan, to_device(inputs, device))
        for name, logits in outputs.items():
            logits = logits.float()
            preds.setdefault(name, []).append(logits.argmax(-1).cpu())
            losses.setdefault(name, []).append(
                nn.functional.cross_entropy(logits, labels, reduction="none").cpu())
    return {name: (torch.cat(preds[name]).numpy(), torch.cat(losses[name]).numpy())
            for name in preds}


def predict(model: LayeredModel, plan, data: Examples, batch_size: int, device: torch.device,
            precision: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """Per-example (predicted class, cross-entropy loss) of the model's single output."""
    return predict_outputs(model, plan, data, batch_size, device, precision)[""]
