"""The local optimizer (SGD or AdamW) and the learning rate over the rounds, checked against
their update rules worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedtune_app.config import ConfigError, RunConfig
from fedtune_app.data.splits import Examples
from fedtune_app.methods import resolve_config
from fedtune_app.training.local import round_lr, train_local
from floats import float64_atol

CPU = torch.device("cpu")
W0 = np.array([1.0, -2.0, 0.5, 3.0])
G = np.array([0.3, -0.001, 2.0, -5.0])  # gradient of the linear loss sum(G * w)


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(W0, dtype=torch.float64))


def steps(cfg: RunConfig, epochs: int) -> np.ndarray:
    """``epochs`` optimizer steps (one batch each) on loss = sum(G * w): gradient G each step."""
    model, g = Linear(), torch.tensor(G)
    data = Examples(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))
    training = cfg.replace(**{"local-epochs": epochs, "batch-size": 4, "grad-clip": 0.0}).training
    train_local(model, [model.w], data, training,
                seed=0, device=CPU, loss_fn=lambda x, y: (g * model.w).sum())
    return model.w.detach().numpy()


def test_sgd_step_is_w_minus_lr_times_gradient_plus_l2():
    cfg = resolve_config({"lr": 0.1, "weight-decay": 0.01, "momentum": 0.9})
    assert cfg.training.optimizer == "sgd"  # the default: the main job is unchanged
    # one step: w - lr (G + wd w); momentum's buffer starts at the first gradient
    expected = W0 - 0.1 * (G + 0.01 * W0)
    np.testing.assert_allclose(steps(cfg, 1), expected, rtol=0,
                               atol=float64_atol(0.1, 5.0, terms=3))


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_adamw_steps_move_each_weight_by_lr_in_the_gradients_direction(weight_decay):
    cfg = resolve_config({"optimizer": "adamw", "lr": 0.01, "weight-decay": weight_decay,
                          "adam-beta1": 0.8, "adam-beta2": 0.99, "adam-eps": 1e-3})
    # with a constant gradient, Adam's bias-corrected moments are m = G and v = G^2 at every
    # step, so each step is w <- w (1 - lr wd) - lr G / (|G| + eps): about lr * sign(G) per
    # weight, whatever |G| (SGD would move the 5.0 weight 5000 times as far as the 0.001 one);
    # the 0.001 gradient moves only by |G| / (|G| + eps) = 1/2 of lr, eps's own effect
    step = 0.01 * G / (np.abs(G) + 1e-3)
    one = W0 * (1 - 0.01 * weight_decay) - step
    two = one * (1 - 0.01 * weight_decay) - step
    atol = float64_atol(0.01, 5.0, terms=8)
    np.testing.assert_allclose(steps(cfg, 1), one, rtol=0, atol=atol)
    np.testing.assert_allclose(steps(cfg, 2), two, rtol=0, atol=atol)


def test_round_lr_warm_up_then_constant_or_cosine():
    base = resolve_config({"lr": 0.2, "num-server-rounds": 10, "lr-warmup-rounds": 0})
    constant = base.replace(**{"lr-schedule": "constant"})
    assert [round_lr(constant, t) for t in (1, 5, 10)] == [0.2, 0.2, 0.2]
    cosine = base.replace(**{"lr-schedule": "cosine"})
    # (1 + cos(pi (t - 1) / 10)) / 2: 1 at t = 1, 1/2 at t = 6, (1 + cos(0.9 pi)) / 2 at t = 10
    assert round_lr(cosine, 1) == 0.2
    assert round_lr(cosine, 6) == pytest.approx(0.1, abs=1e-15)
    assert round_lr(cosine, 10) == pytest.approx(0.2 * (1 + math.cos(0.9 * math.pi)) / 2,
                                                 abs=1e-15)
    warm = cosine.replace(**{"lr-warmup-rounds": 2})
    # rounds 1, 2 ramp to lr; cosine over the 8 rounds 3..10 starts at lr, halves at round 7
    assert round_lr(warm, 1) == pytest.approx(0.1, abs=1e-15)
    assert round_lr(warm, 2) == 0.2
    assert round_lr(warm, 3) == 0.2
    assert round_lr(warm, 7) == pytest.approx(0.1, abs=1e-15)


def test_a_warm_up_over_every_round_is_refused():
    with pytest.raises(ConfigError, match="'lr-warmup-rounds' = 5 covers all 5 rounds"):
        resolve_config({"num-server-rounds": 5, "lr-warmup-rounds": 5, "lr-schedule": "cosine"})
    with pytest.raises(ConfigError, match="'optimizer' = 'adam' is not allowed"):
        resolve_config({"optimizer": "adam"})


@pytest.mark.parametrize("task", ["sst2", "cola", "qqp"])
def test_llama_presets_run_adamw_and_the_vision_presets_sgd(task):
    llama = resolve_config({"preset": f"heterotune-t3-glue-{task}"})
    t = llama.training
    assert (t.optimizer, t.lr, t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay,
            t.lr_schedule) == ("adamw", 1e-5, 0.9, 0.999, 1e-8, 0.0, "constant")
    for preset in ("heterotune-t1-cifar10", "fedra-t1-nico", "fedbrick-t1-nico"):
        cfg = resolve_config({"preset": preset})
        t = cfg.training
        assert (t.optimizer, t.lr, t.lr_schedule) == ("sgd", 0.01, "constant")


def test_clients_train_at_the_rounds_scheduled_rate(tmp_path):
    """Through the real ClientApp: round 1 of a 2-round warm-up from lr 0.2 trains exactly as a
    constant lr 0.2 * 1/2 = 0.1 (the same float), and not as 0.2."""
    import json
    from pathlib import Path

    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.server import run_federation
    from inprocess import InProcessGrid, simulation_nodes

    def round_one(**keys):
        rc = {"preset": "smoke", "num-server-rounds": 1, "results-dir": str(tmp_path)} | keys
        grid = InProcessGrid(client_app, simulation_nodes(3), rc)
        folder = Path(run_federation(grid, resolve_config(rc)))
        return json.loads((folder / "metrics.json").read_text())[0]

    warm = round_one(**{"lr": 0.2, "lr-warmup-rounds": 2})
    half = round_one(lr=0.1)
    full = round_one(lr=0.2)
    assert (warm["loss"], warm["train-loss"]) == (half["loss"], half["train-loss"])
    assert warm["loss"] != full["loss"]
