"""InclusiveFL and DepthFL: allocation, exits, aggregation, losses, inference, end to end."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_MIXER
from fedtune_app.config import ConfigError
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.strategy import ClientInfo, RoundLog
from fedtune_app.federated.wire import TrainTask
from fedtune_app.methods import resolve_config
from fedtune_app.methods.depthfl import (
    DepthFL,
    DepthFLRecipe,
    client_depth,
    ensemble_log_probs,
    exit_depths,
    exit_every,
    self_distillation_loss,
)
from fedtune_app.methods.inclusivefl import InclusiveFL
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, initial_state
from fedtune_app.model.backbones import build_backbone
from floats import NETWORK_FLOAT64_ATOL
from runs import assert_accuracy_counts_the_test_set


def f32(*v):
    return np.array(v, dtype=np.float32)


def cfg(**keys):
    return resolve_config({"preset": "smoke", **keys})


def clients(*capacity_examples):
    return [ClientInfo(100 + i, i, c, n, f"client-{i}")
            for i, (c, n) in enumerate(capacity_examples)]


def tiny_state(num_layers, exits=()):
    names = [f"blocks.{j}.w" for j in range(num_layers)] + [f"exits.{d}.w" for d in exits]
    return {n: f32(0, 0) for n in names + ["head.w"]}


def aggregate_round(strategy, plans: dict[int, tuple], sent: dict[int, dict], examples):
    strategy.history.append(RoundLog(len(strategy.history) + 1, plans=plans))
    updates = [ClientUpdate(str(pid), tensors, examples[pid]) for pid, tensors in sent.items()]
    strategy.state = strategy.aggregate(updates)
    return strategy.state


# -- allocation and exit placement -----------------------------------------------------------

def test_prefix_allocation_of_both_methods():
    infos = clients((3, 10), (1, 10), (2, 10))
    incl = InclusiveFL(cfg(method="inclusivefl"), infos, 4, tiny_state(4))
    assert incl.plan_round(1, infos) == [(0, 1, 2), (0,), (0, 1)]
    depth = DepthFL(cfg(method="depthfl", **{"depthfl-exit-every": 1}), infos, 4,
                    tiny_state(4, exits=(1, 2, 3)))
    assert depth.plan_round(1, infos) == [(0, 1, 2), (0,), (0, 1)]


def test_exit_placement_rules():
    assert exit_depths(12, 3) == (3, 6, 9, 12)
    auto = cfg(method="depthfl", **{"depthfl-exit-every": 0})
    assert exit_every(auto, 12) == 3  # auto: four exits on 12 blocks
    assert exit_every(auto, 6) == 1  # 6-block MiniLM: exit after each block
    assert exit_depths(6, 1) == (1, 2, 3, 4, 5, 6)
    assert exit_depths(6, 4) == (4, 6)  # the model's own head is always the last exit
    assert client_depth(5, (3, 6, 9, 12)) == 3 and client_depth(12, (3, 6, 9, 12)) == 12
    with pytest.raises(ConfigError, match="capacity 2 holds no DepthFL exit"):
        client_depth(2, (3, 6, 9, 12))


EXIT_DEPTH = {"depthfl-client-depth": "exit-depth"}  # DepthFL's own stages


def test_depthfl_plans_payloads_and_bad_capacity():
    infos = clients((3, 10), (4, 10), (2, 10))
    strategy = DepthFL(cfg(method="depthfl", **{"depthfl-exit-every": 2}, **EXIT_DEPTH), infos, 4,
                       tiny_state(4, exits=(2,)))
    plans = strategy.plan_round(1, infos)
    assert plans == [(0, 1), (0, 1, 2, 3), (0, 1)]  # capacity 3 -> depth 2 (exits at 2, 4)
    assert strategy.payload((0, 1)) == ["blocks.0.w", "blocks.1.w", "exits.2.w"]  # no head
    assert strategy.payload((0, 1, 2, 3)) == [f"blocks.{j}.w" for j in range(4)] + \
        ["exits.2.w", "head.w"]
    assert strategy.eval_plan() == (0, 1, 2, 3)
    with pytest.raises(ConfigError, match="capacity 1 holds no DepthFL exit"):
        DepthFL(cfg(method="depthfl", **{"depthfl-exit-every": 2}, **EXIT_DEPTH),
                clients((1, 5)), 4, tiny_state(4, exits=(2,)))
    # at the client's own depth (the default) capacity 3 keeps its 3 blocks, exit 2 and the head
    own = DepthFL(cfg(method="depthfl", **{"depthfl-exit-every": 2}), infos, 4,
                  tiny_state(4, exits=(2,)))
    assert own.plan_round(1, infos) == [(0, 1, 2), (0, 1, 2, 3), (0, 1)]
    assert own.payload((0, 1, 2)) == ["blocks.0.w", "blocks.1.w", "blocks.2.w", "exits.2.w",
                                      "head.w"]
    assert own.payload((0, 1)) == ["blocks.0.w", "blocks.1.w", "head.w"]


def test_exit_heads_averaged_over_their_holders_fedavg_and_feddyn():
    infos = clients((2, 10), (1, 30))
    state = tiny_state(3, exits=(1, 2))
    sent = {0: {"blocks.0.w": f32(1, 1), "blocks.1.w": f32(2, 2), "exits.1.w": f32(1, 0),
                "exits.2.w": f32(2, 4)},
            1: {"blocks.0.w": f32(5, 5), "exits.1.w": f32(5, 4)}}
    plans = {0: (0, 1), 1: (0,)}
    fedavg = DepthFL(cfg(method="depthfl", **{"depthfl-exit-every": 1,
                                              "depthfl-optimizer": "fedavg"}), infos, 3, state)
    new = aggregate_round(fedavg, plans, sent, {0: 10, 1: 30})
    np.testing.assert_allclose(new["exits.1.w"], [(10 * 1 + 30 * 5) / 40, (0 + 30 * 4) / 40])
    np.testing.assert_allclose(new["exits.2.w"], [2, 4])  # held by client 0 only
    np.testing.assert_allclose(new["blocks.0.w"], [4, 4])
    np.testing.assert_array_equal(new["head.w"], [0, 0])  # nobody reached depth 3
    # FedDyn, alpha 0.1, N = 2 clients: h = -alpha * m/N * (mean - theta); theta = mean - h/alpha
    feddyn = DepthFL(cfg(method="depthfl", **{"depthfl-exit-every": 1,
                                              "depthfl-optimizer": "feddyn"}), infos, 3, state)
    new = aggregate_round(feddyn, plans, sent, {0: 10, 1: 30})
    np.testing.assert_allclose(new["exits.1.w"], [4 + 1.0 * 4, 3 + 1.0 * 3])  # m = 2 of 2
    np.testing.assert_allclose(new["exits.2.w"], [2 + 0.5 * 2, 4 + 0.5 * 4])  # m = 1 of 2
    np.testing.assert_allclose(feddyn.h["exits.2.w"], [-0.1 * 0.5 * 2, -0.1 * 0.5 * 4])
    # round 2: nobody moves from the round-1 state -> h stays, theta = state - h/alpha again
    theta = dict(new)
    new = aggregate_round(feddyn, plans, {0: {n: theta[n] for n in sent[0]}}, {0: 10})
    np.testing.assert_allclose(new["exits.2.w"], theta["exits.2.w"] + [1, 2], rtol=1e-6)


# -- InclusiveFL momentum distillation ---------------------------------------------------------

def test_inclusivefl_momentum_distillation_two_groups_two_rounds():
    # small group: depth 1 (client 1, 10 examples); large group: depth 3 (client 0, 30 examples)
    infos = clients((3, 30), (1, 10))
    strategy = InclusiveFL(cfg(method="inclusivefl", **{"inclusivefl-beta": 0.2}), infos, 3,
                           tiny_state(3))
    plans = {0: (0, 1, 2), 1: (0,)}
    # round 1 (from zeros, so replies are updates): no momentum state yet, no distillation
    large1 = {"blocks.0.w": f32(4, 4), "blocks.1.w": f32(2, 0), "blocks.2.w": f32(6, 2),
              "head.w": f32(3, 3)}
    small1 = {"blocks.0.w": f32(1, 1), "head.w": f32(1, 1)}
    s1 = aggregate_round(strategy, plans, {0: large1, 1: small1}, {0: 30, 1: 10})
    np.testing.assert_allclose(s1["blocks.0.w"], [3.25, 3.25])  # (30*4 + 10*1) / 40
    np.testing.assert_allclose(s1["blocks.1.w"], [2, 0])
    np.testing.assert_allclose(s1["head.w"], [2.5, 2.5])
    # round 2: updates D; the small group's top layer (block 0) gets
    # 0.8 * D_small + 0.2 * mean(large group's ROUND-1 updates of blocks 1, 2) = [4, 1]
    d_large = {"blocks.0.w": f32(0, 2), "blocks.1.w": f32(1, 1), "blocks.2.w": f32(3, -1),
               "head.w": f32(0, 0)}
    d_small = {"blocks.0.w": f32(2, 0), "head.w": f32(4, 4)}
    distilled = 0.8 * np.array([2, 0]) + 0.2 * np.array([4, 1])  # [2.4, 0.2]
    s2 = aggregate_round(strategy, plans,
                         {0: {n: s1[n] + d for n, d in d_large.items()},
                          1: {n: s1[n] + d for n, d in d_small.items()}}, {0: 30, 1: 10})
    np.testing.assert_allclose(s2["blocks.0.w"], s1["blocks.0.w"] + (30 * np.array([0, 2])
                                                                      + 10 * distilled) / 40)
    np.testing.assert_allclose(s2["blocks.0.w"], [3.85, 4.8], rtol=1e-6)
    np.testing.assert_allclose(s2["blocks.2.w"], [9, 1])  # layers above: plain mean
    np.testing.assert_allclose(s2["head.w"], [3.5, 3.5])  # the head is not distilled
    # the momentum state now holds each group's latest (distilled) update
    np.testing.assert_allclose(strategy.momentum[1]["blocks.0.w"], distilled, rtol=1e-6)
    np.testing.assert_allclose(strategy.momentum[3]["blocks.1.w"], [1, 1])


def test_inclusivefl_as_the_official_code_runs_it_is_the_plain_mean_over_holders():
    # the same two rounds as above under inclusivefl-aggregation = mean: no distillation, the
    # round-2 small top layer is the example-weighted mean of the two clients' values
    infos = clients((3, 30), (1, 10))
    strategy = InclusiveFL(cfg(method="inclusivefl", **{"inclusivefl-aggregation": "mean"}),
                           infos, 3, tiny_state(3))
    plans = {0: (0, 1, 2), 1: (0,)}
    large = {"blocks.0.w": f32(4, 4), "blocks.1.w": f32(2, 0), "blocks.2.w": f32(6, 2),
             "head.w": f32(3, 3)}
    small = {"blocks.0.w": f32(1, 1), "head.w": f32(1, 1)}
    s1 = aggregate_round(strategy, plans, {0: large, 1: small}, {0: 30, 1: 10})
    np.testing.assert_allclose(s1["blocks.0.w"], [3.25, 3.25])  # (30*4 + 10*1) / 40
    s2 = aggregate_round(strategy, plans, {0: {n: v + 1 for n, v in large.items()},
                                           1: {n: v + 4 for n, v in small.items()}},
                         {0: 30, 1: 10})
    np.testing.assert_allclose(s2["blocks.0.w"], [(30 * 5 + 10 * 5) / 40] * 2)  # [5, 5]
    np.testing.assert_allclose(s2["blocks.2.w"], [7, 3])
    assert strategy.momentum == {}  # no momentum state is kept


# -- DepthFL losses and inference --------------------------------------------------------------

def test_self_distillation_loss_on_fixed_logits():
    p = [[0.5, 0.5], [0.75, 0.25], [0.25, 0.75]]  # softmax of the logits below
    z = [torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3), 0.0]]),
         torch.tensor([[0.0, math.log(3)]])]

    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b))

    ce = -sum(math.log(q[0]) for q in p)  # label 0
    mutual = sum(kl(p[j], p[i]) for i in range(3) for j in range(3) if j != i) / 2
    loss = self_distillation_loss(z, torch.tensor([0]))
    assert loss.item() == pytest.approx(ce + mutual, rel=1e-6)
    assert loss.item() == pytest.approx(2.367123 + 0.823959, abs=1e-5)
    # gradient w.r.t. exit i: (p_i - y) + sum_{j != i} (p_i - p_j) / (n - 1): targets detached
    z1, z2 = (t.clone().requires_grad_(True) for t in z[:2])
    self_distillation_loss([z1, z2], torch.tensor([0])).backward()
    np.testing.assert_allclose(z1.grad.numpy(), [[0.5 - 1 + 0.5 - 0.75, 0.5 + 0.5 - 0.25]],
                               atol=1e-6)


def test_ensemble_is_the_mean_of_the_exit_probabilities():
    z = [torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3), 0.0]])]
    np.testing.assert_allclose(ensemble_log_probs(z).exp().numpy(), [[0.625, 0.375]], atol=1e-6)


def test_exits_on_a_real_model_see_their_prefix_and_the_ensemble_averages_them():
    config = cfg(method="depthfl", **{"depthfl-exit-every": 2}, **EXIT_DEPTH)
    recipe = DepthFLRecipe(config)
    model = recipe.extend(attach_adapters(build_backbone(TINY_MIXER), AdapterSpec())).eval()
    state = initial_state(model, seed=3)
    assert sorted(n for n in state if n.startswith("exits.")) == ["exits.2.bias", "exits.2.weight"]
    # float64: the recipe's exits and the ones composed here are different code, so only
    # rounding may separate them
    model.double()
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        exit2 = model.exits["2"](model.features(x, (0, 1)))  # exit after the first 2 blocks
        exit4 = model(x)  # the model's own head after all 4 blocks
        out = recipe.eval_logits(model, (0, 1, 2, 3), x)
    mean = (exit2.softmax(-1) + exit4.softmax(-1)) / 2
    for got, expected in ((out["exit-2"], exit2), (out["last-exit"], exit4), (out[""].exp(), mean)):
        torch.testing.assert_close(got, expected, rtol=0, atol=NETWORK_FLOAT64_ATOL)
    # a depth-2 client trains blocks 0-1 and exit 2, not the head
    names = sorted(recipe.trainables(model, (0, 1)))
    assert "exits.2.weight" in names and not any(n.startswith("head.") for n in names)
    assert {n.split(".")[1] for n in names if n.startswith("blocks.")} == {"0", "1"}


# -- end to end, in process, through the real ClientApp ---------------------------------------

@pytest.mark.parametrize("method", ["inclusivefl", "depthfl"])
def test_two_rounds_end_to_end(method, tmp_path):
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
    from fedtune_app.apps.server import run_federation

    rc = {"preset": "smoke", "results-dir": str(tmp_path), "method": method}
    grid = InProcessGrid(client_app, simulation_nodes(3), rc)
    cfg = resolve_config(rc)
    folder = Path(run_federation(grid, cfg))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    assert all(not m["rejected"] for m in metrics)
    for m in metrics:  # digits have no domains: the headline is the pooled accuracy
        assert m["accuracy"] == m["accuracy-pooled"]
        assert_accuracy_counts_the_test_set(m, cfg)
    allocation = json.loads((folder / "allocation.json").read_text())
    assert allocation[0]["matrix"] == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]  # 4,2,1: prefix
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    sent_to_smallest = set(TrainTask.from_message(train[2]).arrays)  # partition 2, capacity 1
    blocks = {n.split(".")[1] for n in sent_to_smallest if n.startswith("blocks.")}
    assert blocks == {"0"}
    if method == "depthfl":  # smoke: 4 blocks -> auto k = 1, exits after 1, 2, 3 and the head
        # capacity 1: its one block and the head as its exit (no lost layer, no exit 1)
        assert {n for n in sent_to_smallest if not n.startswith("blocks.")} == \
            {"head.weight", "head.bias"}
        assert {"accuracy-last-exit", "accuracy-ensemble", "accuracy-exit-1"} <= set(metrics[-1])
        # the default headline is the ensemble; the last exit is recorded every evaluation
        assert all(m["accuracy"] == m["accuracy-ensemble"] for m in metrics)
        node = grid.contexts[grid.node_ids[2]]  # FedAvg by default: no FedDyn node state
        assert "depthfl-feddyn-h" not in node.state
    else:
        assert "head.weight" in sent_to_smallest


@pytest.mark.parametrize("headline", ["ensemble", "last-exit"])
def test_both_scores_are_recorded_and_the_key_picks_the_headline(headline):
    config = cfg(method="depthfl", **{"depthfl-exit-every": 2, "depthfl-headline": headline},
                 **EXIT_DEPTH)
    recipe = DepthFLRecipe(config)
    model = recipe.extend(attach_adapters(build_backbone(TINY_MIXER), AdapterSpec())).eval()
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = recipe.eval_logits(model, (0, 1, 2, 3), x)
    # the same tensors under both names: the headline is one of the two recorded scores
    assert out[""] is out[headline]
    assert {"ensemble", "last-exit", "exit-2", "exit-4"} == set(out) - {""}


def test_the_fedra_and_fedbrick_presets_score_depthfl_by_its_last_exit():
    assert resolve_config({"method": "depthfl"}).own.depthfl_headline == "ensemble"
    for preset in ("fedra-t1-nico", "fedra-t2-domainnet", "fedra-t4-nico-dynamic",
                   "fedbrick-t1-nico", "mpnet-fedra-t1-bbc", "offline-feature-skew"):
        depthfl = resolve_config({"preset": preset, "method": "depthfl"})
        assert depthfl.own.depthfl_headline == "last-exit"
