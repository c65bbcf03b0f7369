"""precision = "bf16": bfloat16 autocast on the device, float32 weights and optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import TINY_VIT
from fedtune_app.config import ConfigError
from fedtune_app.data.splits import Examples
from fedtune_app.methods import resolve_config
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, trainable_parameters
from fedtune_app.model.backbones import build_backbone
from fedtune_app.training.local import autocast, check_precision, predict, train_local

CPU = torch.device("cpu")


def tiny_model():
    torch.manual_seed(0)  # peft draws LoRA A from the global RNG: the same model in any test order
    return attach_adapters(build_backbone(TINY_VIT), AdapterSpec(r=4))


def examples(n=48):
    gen = torch.Generator().manual_seed(2)
    return Examples(torch.randn(n, 1, 8, 8, generator=gen),
                    torch.randint(0, 10, (n,), generator=gen))


def test_bf16_autocast_runs_the_matmuls_in_bfloat16():
    model, x = tiny_model(), examples(4).inputs
    with torch.no_grad():
        assert model(x).dtype == torch.float32
        with autocast("fp32", CPU):
            assert model(x).dtype == torch.float32
        with autocast("bf16", CPU):
            assert model(x).dtype == torch.bfloat16


def test_bf16_evaluation_matches_fp32_to_bfloat16_precision():
    model, data = tiny_model(), examples()
    _, loss32 = predict(model, (0, 1, 2, 3), data, 16, CPU, "fp32")
    _, loss16 = predict(model, (0, 1, 2, 3), data, 16, CPU, "bf16")
    assert loss16.dtype == np.float32
    # bfloat16 keeps 8 significant bits (relative step 2^-8 ~ 0.4%): losses ~2.3 agree to ~0.05,
    # but are not bit-identical (autocast really changed the arithmetic)
    assert np.abs(loss16 - loss32).max() < 0.05
    assert not np.array_equal(loss16, loss32)


def test_bf16_training_keeps_float32_weights_and_learns():
    cfg = resolve_config({"precision": "bf16", "lr": 0.1, "local-epochs": 3, "batch-size": 16})
    model, data = tiny_model(), examples()
    sub = model.subnetwork((1, 3))
    params = list(trainable_parameters(sub).values())
    before = [p.detach().clone() for p in params]
    _, loss_before = predict(model, (1, 3), data, 48, CPU, "fp32")
    train_local(sub, params, data, cfg.training, seed=0, device=CPU)
    _, loss_after = predict(model, (1, 3), data, 48, CPU, "fp32")
    assert all(p.dtype == torch.float32 for p in params)
    assert any(not torch.equal(a, b) for a, b in zip(params, before))
    assert loss_after.mean() < loss_before.mean()  # 3 epochs on 48 examples: it fits them


def test_precision_key_is_checked():
    with pytest.raises(ConfigError, match="'precision'.*allowed: fp32, bf16"):
        resolve_config({"precision": "fp16"})
    check_precision("bf16", CPU)  # CPU autocast supports bfloat16: allowed
