"""The papers' settings, one hand-checkable test each: dynamic capacities for the depth
baselines, the LoRA position, DepthFL as FedRA/FedBRICK ran it, the HeteroTune and FedRA
Table 5 presets, per-domain sampling, FedBRICK's round order and FedDyn, the headline accuracy,
and the official FedRA code's batch cap and unweighted means."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.evaluation import GlobalEvaluator, build_global
from fedtune_app.apps.server import run_federation
from fedtune_app.config import ConfigError
from fedtune_app.data.groups import group_depths, node_model_group
from fedtune_app.data.scenarios import client_capacities
from fedtune_app.data.splits import Examples
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.strategy import ClientInfo, RoundLog, from_record
from fedtune_app.federated.wire import TrainReply, TrainTask
from fedtune_app.methods import resolve_config
from fedtune_app.methods.depthfl import DepthFL, consistency_weight, self_distillation_loss
from fedtune_app.methods.fedbrick import FedBRICK, initial_bricks
from fedtune_app.methods.fedra import FedRA
from fedtune_app.methods.inclusivefl import InclusiveFL
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, trainable_parameters
from fedtune_app.model.backbones import ModelSpec, build_backbone
from fedtune_app.tools.compare import summarize
from inprocess import InProcessGrid, simulation_nodes


def smoke(**keys):
    return resolve_config({"preset": "smoke", **keys})


def infos(*capacity_examples, groups=None):
    return [ClientInfo(100 + i, i, c, n, groups[i] if groups else f"client-{i}")
            for i, (c, n) in enumerate(capacity_examples)]


def zeros(names):
    return {n: np.zeros(2, np.float32) for n in names}


def f32(*v):
    return np.array(v, dtype=np.float32)


# -- 1. dynamic heterogeneity reaches DepthFL and InclusiveFL ----------------------------------

def test_depthfl_plans_the_rounds_drawn_capacities(tmp_path):
    rc = {"preset": "smoke", "method": "depthfl", "dynamic-capacities": True, "seed": 5,
          "num-server-rounds": 2, "train-subset": 120, "test-subset": 30,
          "results-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, simulation_nodes(3), rc)
    folder = Path(run_federation(grid, resolve_config(rc)))
    # smoke capacities 4,2,1; each round client i holds U[1, L_i] blocks from the seeded RNG
    # (DepthFL draws nothing else), i.e. the prefix of that depth
    rng = np.random.default_rng([5, 2])  # the strategy's capacity stream of seed 5
    drawn = [[int(rng.integers(1, c + 1)) for c in (4, 2, 1)] for _ in range(2)]
    allocation = json.loads((folder / "allocation.json").read_text())
    for round_, caps in zip(allocation, drawn):
        assert round_["matrix"] == [[1] * c + [0] * (4 - c) for c in caps]
    assert drawn[0] != [4, 2, 1] or drawn[1] != [4, 2, 1]  # the seed draws below the static ones


def test_inclusivefl_distils_between_the_depths_of_a_dynamic_round():
    # static capacities 4 and 4 (one group); this dynamic round drew depths 3 and 1
    config = smoke(method="inclusivefl", **{"dynamic-capacities": True})
    strategy = InclusiveFL(config, infos((4, 30), (4, 10)), 3,
                           zeros([f"blocks.{j}.w" for j in range(3)] + ["head.w"]))
    plans = {0: (0, 1, 2), 1: (0,)}

    def round_(large, small):
        strategy.history.append(RoundLog(len(strategy.history) + 1, plans=plans))
        updates = [ClientUpdate("0", large, 30), ClientUpdate("1", small, 10)]
        strategy.state = strategy.aggregate(updates)
        return strategy.state

    s1 = round_({"blocks.0.w": f32(4, 4), "blocks.1.w": f32(2, 0), "blocks.2.w": f32(6, 2),
                 "head.w": f32(3, 3)}, {"blocks.0.w": f32(1, 1), "head.w": f32(1, 1)})
    # round 2: the depth-1 group's top layer gets 0.8 * its update [2, 0] + 0.2 * the mean of
    # the depth-3 group's round-1 updates of blocks 1, 2 ([2, 0], [6, 2] -> [4, 1]) = [2.4, 0.2]
    s2 = round_({"blocks.0.w": s1["blocks.0.w"] + f32(0, 2), "blocks.1.w": s1["blocks.1.w"],
                 "blocks.2.w": s1["blocks.2.w"], "head.w": s1["head.w"]},
                {"blocks.0.w": s1["blocks.0.w"] + f32(2, 0), "head.w": s1["head.w"]})
    np.testing.assert_allclose(s2["blocks.0.w"] - s1["blocks.0.w"],
                               (30 * np.array([0, 2]) + 10 * np.array([2.4, 0.2])) / 40,
                               rtol=1e-6)


# -- 2. LoRA on the last FC of both sublayers ---------------------------------------------------

@pytest.mark.parametrize("model, modules, per_block", [
    # ViT-B: attn.proj 768 -> 768: 8*768 + 768*8 = 12,288; mlp.fc2 3072 -> 768: 8*3072 +
    # 768*8 = 30,720; both = 43,008 = FedBRICK Table 3's "43.0K"
    ("vit_base_patch16_224", "last-fc", 43_008),
    ("vit_base_patch16_224", "last-fc-attn", 12_288),
    ("vit_base_patch16_224", "last-fc-mlp", 30_720),
    # Mixer-B: mlp_tokens.fc2 384 -> 196: 8*384 + 196*8 = 4,640; mlp_channels.fc2 30,720;
    # both = 35,360 = FedBRICK Table 3's "35.3K"
    ("mixer_b16_224", "last-fc", 35_360),
])
def test_lora_parameters_per_block_match_fedbrick_table_3(model, modules, per_block):
    with torch.device("meta"):  # architecture only
        net = attach_adapters(build_backbone(ModelSpec(model, "random", "", 3, 100)),
                              AdapterSpec(modules=modules))
    params = trainable_parameters(net)
    assert sum(p.numel() for n, p in params.items() if n.startswith("blocks.5.")) == per_block
    assert sum(p.numel() for n, p in params.items() if n.startswith("head.")) == 76_900


def test_default_position_on_a_bert_block(tiny_bert_dir):
    net = attach_adapters(build_backbone(ModelSpec(tiny_bert_dir, "random", "", 0, 5)),
                          AdapterSpec())
    assert sorted({n.split(".", 2)[2].rsplit(".", 2)[0] for n in trainable_parameters(net)
                   if n.startswith("blocks.1.")}) == ["attention.output.dense", "output.dense"]


# -- 3. DepthFL as the FedRA and FedBRICK papers ran it ----------------------------------------

def test_depthfl_defaults_fedavg_ramp_and_no_lost_layers():
    config = resolve_config({"method": "depthfl"})
    assert config.own.depthfl_optimizer == "fedavg" and config.own.depthfl_consistency_ramp == 500
    caps = infos(*[(c, 10) for c in (12, 10, 8, 6, 4, 3)])
    names = [f"blocks.{j}.w" for j in range(12)] + [f"exits.{d}.w" for d in (3, 6, 9)] + \
        ["head.w"]
    own = DepthFL(config, caps, 12, zeros(names))
    assert [len(p) for p in own.plan_round(1, caps)] == [12, 10, 8, 6, 4, 3]
    # a depth-10 client: exits after 3, 6, 9 blocks and the head after its 10th
    assert [n for n in own.payload(tuple(range(10))) if not n.startswith("blocks.")] == \
        ["exits.3.w", "exits.6.w", "exits.9.w", "head.w"]
    assert own.objective == ("plain", 0.0)
    paper = DepthFL(config.replace(**{"depthfl-client-depth": "exit-depth"}), caps, 12,
                    zeros(names))
    assert [len(p) for p in paper.plan_round(1, caps)] == [12, 9, 6, 6, 3, 3]
    # w_t = exp(-5 (1 - min(t-1, T)/T)^2): round 1 exp(-5); round 251 exp(-5/4); from 501 on 1
    assert consistency_weight(1, 500) == pytest.approx(math.exp(-5))
    assert consistency_weight(251, 500) == pytest.approx(math.exp(-1.25))
    assert consistency_weight(501, 500) == consistency_weight(900, 500) == 1.0
    assert consistency_weight(1, 0) == 1.0
    # two exits with p = (1/2, 1/2) and (3/4, 1/4), label 0: CE = ln 2 + ln 4/3; the KL terms
    # sum to KL(q||p) + KL(p||q) = 0.5 ln 3 - 0.5 ln(4/3) ... weighted by w
    z = [torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3), 0.0]])]
    p, q = [0.5, 0.5], [0.75, 0.25]
    kl = sum(a * math.log(a / b) for a, b in zip(q, p)) + sum(a * math.log(a / b)
                                                           for a, b in zip(p, q))
    ce = math.log(2) + math.log(4 / 3)
    w = math.exp(-5)
    assert self_distillation_loss(z, torch.tensor([0]), w).item() == pytest.approx(ce + w * kl,
                                                                                   rel=1e-6)


# -- 4. HeteroTune presets run HeteroTune on ViT-T/S/B/L ----------------------------------------

@pytest.mark.parametrize("preset, counts", [("heterotune-t1-cifar10", [30, 30, 20, 20]),
                                            ("heterotune-t5-cifar10-ratio", [60, 20, 10, 10])])
def test_heterotune_presets_are_model_group_runs(preset, counts):
    for method in ("heterotune", "homo", "fedmd", "feddf", "flexifed", "pfedlora", "all-small",
                   "all-large"):
        resolve_config({"preset": preset, "method": method})  # no "needs model groups"
    config = resolve_config({"preset": preset})
    assert config.method == "heterotune"
    assert config.model.model_groups.split(";") == [f"vit_{s}_patch16_224"
                                                 for s in ("tiny", "small", "base", "large")]
    groups = [node_model_group(config, pid, 100, 1) for pid in range(100)]
    assert [groups.count(g) for g in range(4)] == counts
    assert group_depths(config) == [12, 12, 12, 24]


# -- 5. FedRA Table 5 on its all-smaller profiles ----------------------------------------------

def test_fedra_table_5_presets_use_the_all_smaller_profiles():
    profiles = {"4": [4] * 6, "6": [6] * 6, "10": [10] * 6, "mixed": [10, 10, 6, 6, 4, 4]}
    for name, caps in profiles.items():
        eq3 = resolve_config({"preset": f"fedra-t5-nico-eq3-{name}"})
        eq2 = resolve_config({"preset": f"fedra-t3-nico-{name}"})  # Table 5's Eq. 2 row
        assert client_capacities(eq3) == client_capacities(eq2) == caps
        assert max(caps) < 12  # some block can be missing in a round: Eq. 2 and 3 differ
        assert eq3.federation.missing_layer_policy == "cover-all"
        assert eq2.federation.missing_layer_policy == "keep-previous"
        assert {k for k in eq3.flat if eq3.flat[k] != eq2.flat[k]} == {"preset",
                                                                      "missing-layer-policy"}


# -- 6. one client per domain each round (FedRA Table 2) ----------------------------------------

def test_per_domain_sampling_picks_one_client_of_each_domain():
    domains = ["a", "a", "b", "b", "b", "c"]
    # the smoke data has no domains (resolving would refuse per-domain sampling): the clients'
    # domains come from their infos here
    config = smoke(seed=3).replace(**{"client-sampling": "per-domain"})
    strategy = FedRA(config, infos(*[(1, 10)] * 6, groups=domains), 4, {})
    rng = np.random.default_rng([3, 1])  # the sampling stream of seed 3; per round: an index
    # into a's 2, b's 3, c's 1 clients
    for _ in range(4):
        expected = [0 + rng.integers(2), 2 + rng.integers(3), 5 + rng.integers(1)]
        picked = [c.partition_id for c in strategy.sample_clients()]
        assert picked == expected
        assert sorted(domains[p] for p in picked) == ["a", "b", "c"]
    for t2 in ("fedra-t2-nico", "fedra-t2-domainnet"):
        assert resolve_config({"preset": t2}).federation.client_sampling == "per-domain"
    with pytest.raises(ConfigError, match="'client-sampling' = 'per-domain' needs"):
        smoke(**{"client-sampling": "per-domain"})
    with pytest.raises(ConfigError, match="each of the 6 domains; set it to 6 or 0"):
        resolve_config({"preset": "offline-feature-label-skew", "clients-per-round": 5})


# -- 7. FedBRICK: BRICKs distilled before round 1's clients get them; FedDyn's server step ------

def test_fedbrick_first_round_clients_receive_distilled_bricks(tmp_path):
    rc = {"preset": "offline-feature-skew", "model-source": "random", "method": "fedbrick",
          "domains": "original,inverted", "capacities": "4,2", "num-server-rounds": 1,
          "train-subset": 100, "test-subset": 20, "batch-size": 16,
          "fedbrick-server-epochs": 1, "results-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, simulation_nodes(2), rc)
    folder = Path(run_federation(grid, resolve_config(rc)))
    sent = [from_record(TrainTask.from_message(m).arrays) for m in grid.sent
            if m.metadata.message_type == "train"]
    # the same distillation, run again from the initial state: the BRICKs of round 1
    cfg = resolve_config(rc)
    model, recipe = build_global(cfg)
    clients = [ClientInfo(**c) for c in json.loads((folder / "config.json").read_text())
               ["clients"]]
    again = FedBRICK(cfg, clients, model.num_blocks, recipe.initial_state(model, cfg.seed))
    again.attach(model, recipe)
    initial = initial_bricks(again.state, cfg.seed)
    again.server_distill(again.state, 1)
    for payload, domain in zip(sent, ("original", "inverted")):
        bricks = {n: v for n, v in payload.items() if n.startswith("bricks.")}
        assert bricks and all(n.startswith(f"bricks.{domain}.") for n in bricks)
        assert all(np.array_equal(v, again.state[n]) for n, v in bricks.items())
        assert not np.array_equal(bricks[f"bricks.{domain}.0.B1"],
                                  initial[f"bricks.{domain}.0.B1"])  # B1 = 0 before
    metrics = json.loads((folder / "metrics.json").read_text())
    assert set(metrics[0]["server-distill-mse"]) == {"original", "inverted"}


def test_fedbrick_applies_feddyns_server_step():
    cfg = resolve_config({"preset": "offline-feature-skew", "method": "fedbrick",
                          "local-objective": "feddyn", "feddyn-alpha": 0.1,
                          "fedbrick-server-epochs": 0, "capacities": "2,1", "partitioner": "iid"})
    names = ["blocks.0.w", "blocks.1.w", "head.w", "bricks.all.0.B1", "bricks.all.1.B1"]
    strategy = FedBRICK(cfg, infos((2, 10), (1, 30)), 2, zeros(names))
    strategy.history.append(RoundLog(1, plans={0: (0, 1), 1: (1,)}))
    new = strategy.aggregate([ClientUpdate("0", {"blocks.0.w": f32(4, 4), "head.w": f32(1, 1)},
                                           10),
                              ClientUpdate("1", {"head.w": f32(5, 5)}, 30)])
    # head: mean 4 held by 2 of 2 clients: h = -0.1 * 1 * 4 = -0.4; theta = 4 + 0.4/0.1 = 8
    np.testing.assert_allclose(new["head.w"], [8, 8], rtol=1e-6)
    # blocks.0: mean 4 held by 1 of 2: h = -0.1 * 0.5 * 4 = -0.2; theta = 4 + 2 = 6
    np.testing.assert_allclose(new["blocks.0.w"], [6, 6], rtol=1e-6)
    assert new["blocks.1.w"].tolist() == [0, 0]  # nobody sent it


# -- 8. the headline: the mean over domains ----------------------------------------------------

def test_headline_accuracy_is_the_mean_over_domains():
    evaluator = GlobalEvaluator.__new__(GlobalEvaluator)
    evaluator.test = Examples(torch.zeros(6, 1), torch.zeros(6, dtype=torch.long),
                              torch.tensor([0, 0, 1, 1, 1, 1]))
    evaluator.domain_names = ["small", "large"]
    correct = np.array([True, True, True, False, False, False])
    assert evaluator.per_domain(correct) == {"small": 1.0, "large": 0.25}
    assert evaluator.headline(correct) == pytest.approx((1.0 + 0.25) / 2)  # pooled: 3/6
    evaluator.test = Examples(torch.zeros(6, 1), torch.zeros(6, dtype=torch.long))
    assert evaluator.headline(correct) == pytest.approx(0.5)  # no domains: all test examples


def test_compare_reports_the_headline_and_the_pooled_overall(tmp_path):
    record = {"round": 3, "accuracy": 0.625, "accuracy-pooled": 0.5,
              "accuracy-per-group": {"small": 1.0, "large": 0.25}}
    (tmp_path / "metrics.json").write_text(json.dumps([record]))
    (tmp_path / "config.json").write_text(json.dumps({"run-config": {"seed": 0}}))
    row = summarize("fedra", tmp_path)
    assert row["columns"] == {"small": 1.0, "large": 0.25, "test accuracy": 0.625,
                              "overall": 0.5}
    assert "accuracy-pooled" not in row["extras"]


# -- 9. the official FedRA code's batch cap and unweighted means (off by default) -------------

def test_official_fedra_batch_cap_and_unweighted_means(tmp_path):
    assert not smoke().training.fedra_repo_batch_cap
    assert not smoke().federation.fedra_repo_unweighted
    # smallest client 65 examples at batch 32: m = 3 batches; the official loop runs m + 1
    capped = FedRA(smoke(**{"fedra-repo-batch-cap": True}),
                   infos((1, 100), (1, 65), (1, 300)), 4, {})
    assert capped.max_batches() == 4
    data = Examples(torch.zeros(300, 1), torch.zeros(300, dtype=torch.long), max_batches=4)
    assert [len(y) for _, y in data.batches(32)] == [32] * 4 and data.num_batches(32) == 4
    # a real run: every client gets the cap; all-large's means count each client once
    replies = {}

    def keep(msg, reply):
        if msg.metadata.message_type == "train":
            replies[msg.metadata.dst_node_id] = from_record(TrainReply.from_message(reply).arrays)
        return reply

    rc = {"preset": "smoke", "method": "all-large", "num-server-rounds": 1, "train-subset": 150,
          "test-subset": 30, "fedra-repo-batch-cap": True, "fedra-repo-unweighted": True,
          "results-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, simulation_nodes(3), rc, {p: keep for p in range(3)})
    folder = Path(run_federation(grid, resolve_config(rc)))
    examples = [c["num_examples"] for c in json.loads((folder / "config.json").read_text())
                ["clients"]]
    assert len(set(examples)) > 1  # unequal clients: weighted and unweighted means differ
    cap = math.ceil(min(examples) / 32) + 1
    assert {TrainTask.from_message(m).max_batches for m in grid.sent
            if m.metadata.message_type == "train"} == {cap}
    from safetensors.numpy import load_file
    state = load_file(str(folder / "state.safetensors"))
    for name in ("blocks.3.mlp_channels.fc2.lora_B.weight", "head.weight"):
        mean = np.mean([r[name].astype(np.float64) for r in replies.values()], axis=0)
        np.testing.assert_allclose(state[name], mean, rtol=1e-6, atol=1e-7)


# -- AllSmall under dynamic capacities: FedRA Table 4's row is Table 1's 3-layer model ------------

def test_all_small_under_dynamic_capacities_trains_the_table1_model():
    from fedtune_app.methods.baselines import AllSmall

    config = resolve_config({"preset": "fedra-t4-nico-dynamic", "method": "all-small"})
    assert (config.own.all_small_layers, config.federation.capacities) == (3, "12*6")
    strategy = AllSmall(config, infos(*[(12, 10)] * 6), 12, zeros(["head.w"]))
    # whatever the round drew (here 1 and 12 blocks), every client trains blocks 0, 1, 2
    drawn = infos((1, 10), (12, 10))
    assert strategy.plan_round(1, drawn) == [(0, 1, 2), (0, 1, 2)]
    assert strategy.eval_plan() == (0, 1, 2)
    # by default the smallest static capacity, dynamic or not (no longer 1 under dynamic)
    for dynamic in (False, True):
        plain = smoke(method="all-small", **{"dynamic-capacities": dynamic})
        assert AllSmall(plain, infos((4, 10), (2, 10), (3, 10)), 4,
                        zeros(["head.w"])).eval_plan() == (0, 1)
    with pytest.raises(ConfigError, match="'all-small-layers' = 3 is deeper than the smallest"):
        smoke(method="all-small", **{"all-small-layers": 3})  # smoke: capacities 4,2,1
