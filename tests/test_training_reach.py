"""Screening's bound on how far local training can move a tensor whose gradient is bounded
whatever the data (the classification head's bias under cross-entropy): ``robust.sgd_reach``
worked out by hand, checked against torch's own SGD, and the recipes' ``update_bounds``."""

import math

import pytest
import torch
from torch import nn

from fedtune_app.federated.robust import REACH_SLACK, screen_verdict, sgd_reach
from fedtune_app.methods import METHODS, recipe_for, resolve_config
from fedtune_app.training.recipes import ClientRecipe


def test_sgd_reach_by_hand():
    # momentum 0.5, gradient norm 1, lr 0.1: speeds 1, 1.5, 1.75 -> 0.1 + 0.15 + 0.175
    assert sgd_reach(3, 0.1, 0.5, 1.0) == pytest.approx(0.425, rel=1e-15)
    # weight decay 0.1 from norm 2: speeds 1 + 0.2 = 1.2, then 0.6 + 1 + 0.1 x 2.12 = 1.812
    assert sgd_reach(2, 0.1, 0.5, 1.0, weight_decay=0.1, start_norm=2.0) == pytest.approx(
        0.12 + 0.1812, rel=1e-15)
    # FedProx mu 1: speeds 1, then 0.5 + 1 + 0.1 (the distance moved so far)
    assert sgd_reach(2, 0.1, 0.5, 1.0, pull=1.0) == pytest.approx(0.1 + 0.16, rel=1e-15)
    assert sgd_reach(0, 0.1, 0.5, 1.0) == 0.0
    # weight decay pulls from the tensor's own norm, 0 unless given: lr x (1 + 0.5 x 0)
    assert sgd_reach(1, 0.1, 0.0, 1.0, weight_decay=0.5) == pytest.approx(0.1, rel=1e-15)
    # without momentum: S steps of lr x G each
    assert sgd_reach(7, 0.01, 0.0, math.sqrt(2)) == pytest.approx(0.07 * math.sqrt(2),
                                                                   rel=1e-15)


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_a_constant_gradient_of_the_bound_reaches_it_exactly_with_torch_sgd(momentum):
    # loss <g, w> has gradient g at every step: torch's SGD moves w by exactly sgd_reach
    g = torch.tensor([0.6, -0.8, 0.0], dtype=torch.float64) * 2.5  # norm 2.5
    w = nn.Parameter(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    start = w.detach().clone()
    optimizer = torch.optim.SGD([w], lr=0.05, momentum=momentum)
    for _ in range(12):
        optimizer.zero_grad()
        (g * w).sum().backward()
        optimizer.step()
    moved = float((w.detach() - start).norm())
    assert moved == pytest.approx(sgd_reach(12, 0.05, momentum, 2.5), rel=1e-12)


def test_an_honest_single_class_head_stays_within_its_reach():
    # a linear head trained with cross-entropy on one class's examples, the setting where the
    # bias moves furthest: its move is within the bound (and not far below it)
    gen = torch.Generator().manual_seed(0)
    head = nn.Linear(8, 5)
    features = torch.randn(40, 8, generator=gen)
    labels = torch.full((40,), 3)
    bias = head.bias.detach().clone()
    optimizer = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for _ in range(2):
        for start in range(0, 40, 8):
            optimizer.zero_grad()
            nn.functional.cross_entropy(head(features[start:start + 8]),
                                        labels[start:start + 8]).backward()
            optimizer.step()
    moved = float((head.bias.detach() - bias).norm())
    reach = sgd_reach(10, 0.05, 0.9, math.sqrt(2), 1e-4, float(bias.norm()))
    assert 0.3 * reach < moved <= reach


def test_the_reach_alone_judges_with_float32_slack():
    robust = resolve_config({}).robust
    # far beyond both other rules (1000 x the peers' median, rms 50 x the global tensor's) but
    # within the reach: passes; exactly at the reach plus float32 slack: passes
    for length in (2.0, 2.0 * (1 + REACH_SLACK / 2), 2.0 * (1 + REACH_SLACK)):
        assert screen_verdict(5.0, 0.1, length, 0.002, 6, robust, reach=2.0) is None
    assert screen_verdict(0.0, 0.1, 2.0 * (1 + 2 * REACH_SLACK), 1.0, 6, robust, reach=2.0) == (
        "update norm 2 > 2, the farthest its local training can move it")
    assert screen_verdict(0.0, 0.1, 3.0, 1.0, 2, robust, peers=False, reach=2.5) == (
        "update norm 3 > 2.5, the farthest its local training can move it")


def reach_config(**keys):
    return resolve_config({"preset": "smoke", "lr": 0.1, "momentum": 0.5, "batch-size": 4,
                           "local-epochs": 2, "weight-decay": 0.0, "grad-clip": 0.0,
                           "lr-schedule": "constant", "lr-warmup-rounds": 0, **keys})


SENT = {"head.bias": torch.zeros(3).numpy(), "blocks.0.w": torch.ones(2).numpy()}


def test_update_bounds_follow_the_clients_training():
    bounds = lambda cfg, n=10, **kw: recipe_for(cfg).update_bounds(SENT, n, 1, **kw)  # noqa: E731
    cfg = reach_config()
    # 10 examples, batch 4: 3 batches x 2 epochs = 6 steps, 0.2 sqrt(2) (6 - 1 + 0.5^6)
    six = 0.2 * math.sqrt(2) * (5 + 0.5 ** 6)
    assert bounds(cfg) == {"head.bias": pytest.approx(six, rel=1e-12)}
    # at most 2 batches an epoch: 4 steps
    assert bounds(cfg, max_batches=2)["head.bias"] == pytest.approx(
        0.2 * math.sqrt(2) * (3 + 0.5 ** 4), rel=1e-12)
    # gradients clipped to 0.5: the bound scales from sqrt(2) to 0.5
    assert bounds(reach_config(**{"grad-clip": 0.5}))["head.bias"] == pytest.approx(
        six / math.sqrt(2) * 0.5, rel=1e-12)
    # a warm-up of 4 rounds: round 1 trains at lr / 4
    assert bounds(reach_config(**{"lr-warmup-rounds": 4}))["head.bias"] == pytest.approx(
        six / 4, rel=1e-12)
    # FedProx adds mu x the distance moved: a larger bound
    assert bounds(reach_config(**{"local-objective": "fedprox", "fedprox-mu": 0.5}))[
        "head.bias"] > six
    # no bound where the update is not plain SGD on the cross-entropy: AdamW, FedDyn's state
    assert bounds(reach_config(optimizer="adamw")) == {}
    assert bounds(reach_config(**{"local-objective": "feddyn"})) == {}
    assert bounds(reach_config(method="depthfl")) == {}
    # a tensor the client was not sent has no bound
    assert recipe_for(cfg).update_bounds({"blocks.0.w": SENT["blocks.0.w"]}, 10, 1) == {}


def test_every_recipe_with_its_own_loss_or_training_states_its_own_gradient_bounds():
    for method in METHODS.values():
        recipe = method.recipe
        own = any(getattr(recipe, f) is not getattr(ClientRecipe, f) for f in ("loss", "fit"))
        if own:
            assert "gradient_bounds" in vars(recipe), method.name
