"""HeteroTune: FedAdapter (Eq. 5), fusion (Eq. 6), grouped aggregation (Algorithm 1),
trainable tensors per group, and a two-group federation of tiny random-init ViTs."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from torch import nn

from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.data.groups import group_config
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.strategy import ClientInfo
from fedtune_app.methods import recipe_for, resolve_config, strategy_class
from fedtune_app.methods.heterotune import FedAdapter, ShareBank, fuse_state, position
from fedtune_app.model.backbones import ModelSpec
from floats import NETWORK_FLOAT64_ATOL, float32_atol
from test_model_groups import TWO_GROUPS

CFG = {**TWO_GROUPS, "method": "heterotune"}
# r = 8, M = 2 branches, P = min depth = 2 positions; per block two FedAdapters (attn.proj and
# mlp.fc2, both of output width d), each W_d d x 8 + W_u 8 x d + 2 branch weights; own share
# branch (one per position, used by both): 2 positions x (8x8 down + 8x8 up); head d x 10 + 10
TRAINED = {0: 2 * 2 * (16 * 8 * 2 + 2) + 2 * 128 + 170,   # 1458
           1: 3 * 2 * (32 * 8 * 2 + 2) + 2 * 128 + 330}   # 3670


def gelu(z):
    return z * 0.5 * (1 + math.erf(z / math.sqrt(2)))


def tiny_adapter():
    """d = 2, r = 1, M = 2, identity base: y = x."""
    base = nn.Linear(2, 2)
    bank = ShareBank(positions=1, groups=2, r=1)
    adapter = FedAdapter(base, r=1, groups=2, bank=bank, pos=0)
    with torch.no_grad():
        base.weight.copy_(torch.eye(2))
        base.bias.zero_()
        adapter.adapter["down"].copy_(torch.tensor([[1.0], [2.0]]))
        adapter.adapter["up"].copy_(torch.tensor([[1.0, -1.0]]))
        adapter.adapter["branch"].copy_(torch.tensor([0.5, 2.0]))
        for i, (sd, su) in enumerate([(2.0, 1.0), (3.0, 0.5)]):
            bank.adapter["0"][str(i)]["down"].fill_(sd)
            bank.adapter["0"][str(i)]["up"].fill_(su)
    return adapter


def test_fedadapter_forward_is_eq5_on_fixed_tensors():
    adapter = tiny_adapter()
    # y = x; y W_d = 0.1; sum a_i S_d^i = 0.5*2 + 2*3 = 7; sum a_i S_u^i = 0.5*1 + 2*0.5 = 1.5
    h = gelu(0.1 * 7) * 1.5
    out = adapter(torch.tensor([[0.1, 0.0]]))
    np.testing.assert_allclose(out.detach().numpy(), [[0.1 + h, 0.0 - h]], rtol=1e-6)
    a, b = adapter.fused_matrices()  # Eq. 6: A' = W_d * 7, B' = 1.5 * W_u
    np.testing.assert_allclose(a.detach().numpy(), [[7.0], [14.0]])
    np.testing.assert_allclose(b.detach().numpy(), [[1.5, -1.5]])


def test_fused_and_unfused_outputs_match_on_a_trained_looking_model():
    cfg = resolve_config(CFG)
    recipe = recipe_for(cfg, 1)
    model = recipe.build(ModelSpec.from_config(group_config(cfg, 1).model, 10))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # every adapter tensor random, so no term is trivially zero
        for p in model.parameters():
            if p.requires_grad or p.dim() == 2 and p.shape[0] == p.shape[1] == 8:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(4, 1, 8, 8, generator=gen)
    # the saved (numpy) fusion equals the module's, both float32 as saved
    state = {n: p.detach().numpy().copy() for n, p in recipe.received(model, ()).items()}
    saved = fuse_state(state, depths=[2, 3], positions=2)
    adapter = model.blocks[2].mlp.fc2
    a, b = adapter.fused_matrices()
    # each entry of A' = W_d (sum_i a_i S_d^i) and B' = (sum_i a_i S_u^i) W_u is a sum of
    # r * M = 16 products of three factors (W, a_i, S^i) that numpy and torch sum in their own
    # order: the float32 bound of two such evaluations, from the largest factors present
    prefix = "groups.1.blocks.2.mlp.fc2.adapter."
    branch, r = state[prefix + "branch"], state[prefix + "down"].shape[1]
    for fused, weight, got in (("A", "down", a), ("B", "up", b)):
        shares = [state[f"share.adapter.1.{i}.{weight}"] for i in range(len(branch))]
        atol = float32_atol(np.abs(state[prefix + weight]).max(), np.abs(branch).max(),
                            max(np.abs(s).max() for s in shares), terms=r * len(branch))
        np.testing.assert_allclose(saved[prefix + fused], got.detach().numpy(), rtol=0, atol=atol)
    assert not any(n.startswith("share.") or n.endswith(("branch", "down", "up")) for n in saved)
    # the fused and unfused forward passes through the whole network (GELU, attention, norms):
    # two float64 evaluations of the same function, so only float64 rounding separates them
    model.double()
    x = x.double()
    with torch.no_grad():
        unfused = model(x)
        fused = recipe.eval_logits(model, tuple(range(3)), x)[""]
        assert not any(m.fused for m in model.modules() if isinstance(m, FedAdapter))  # restored
        torch.testing.assert_close(fused, unfused, rtol=0, atol=NETWORK_FLOAT64_ATOL)
        # the adapters do change the output (the check above is not vacuous)
        for m in model.modules():
            if isinstance(m, FedAdapter):
                m.adapter["up"].zero_()
        assert (model(x) - unfused).abs().max() > 1e-3


def test_relative_depth_maps_blocks_onto_share_positions():
    assert [position(j, 3, 2) for j in range(3)] == [0, 0, 1]
    assert [position(j, 2, 2) for j in range(2)] == [0, 1]
    assert [position(j, 24, 12) for j in range(24)] == [j // 2 for j in range(24)]
    cfg = resolve_config(CFG)
    model = recipe_for(cfg, 1).build(ModelSpec.from_config(group_config(cfg, 1).model, 10))
    assert [model.blocks[j].mlp.fc2.pos for j in range(3)] == [0, 0, 1]


def test_a_group_client_trains_its_local_adapters_branch_weights_head_and_own_branch():
    cfg = resolve_config(CFG)
    recipe = recipe_for(cfg, 0)
    model = recipe.build(ModelSpec.from_config(group_config(cfg, 0).model, 10))
    local = {f"groups.0.blocks.{j}.{m}.adapter.{w}" for j in (0, 1)
             for m in ("attn.proj", "mlp.fc2") for w in ("down", "up", "branch")}
    own = {f"share.adapter.{p}.0.{w}" for p in (0, 1) for w in ("down", "up")}
    other = {f"share.adapter.{p}.1.{w}" for p in (0, 1) for w in ("down", "up")}
    head = {"groups.0.head.weight", "groups.0.head.bias"}
    trained = recipe.trainables(model, (0, 1))
    assert set(trained) == local | own | head
    assert set(recipe.received(model, (0, 1))) == local | own | other | head
    assert {n for n, p in model.named_parameters() if p.requires_grad} == \
        {n.removeprefix("groups.0.") for n in local | own | head}
    assert sum(p.numel() for p in trained.values()) == TRAINED[0]


def test_without_learnable_weights_the_branch_weights_stay_at_one_over_m():
    # Table 4's "w/o LW": a_i = 1/M fixed; neither trained nor sent back
    cfg = resolve_config(CFG | {"heterotune-learnable-weights": False})
    recipe = recipe_for(cfg, 0)
    model = recipe.build(ModelSpec.from_config(group_config(cfg, 0).model, 10))
    trained = recipe.trainables(model, (0, 1))
    assert not any(n.endswith(".adapter.branch") for n in trained)
    branch = "groups.0.blocks.0.mlp.fc2.adapter.branch"
    assert branch in recipe.received(model, (0, 1))
    np.testing.assert_array_equal(recipe.initial_state(model, 0)[branch], [0.5, 0.5])  # M = 2
    clients = [ClientInfo(10, 0, 1, 10, "c0", model_group=0)]
    strategy = strategy_class(cfg)(cfg, clients, 3, {branch: np.full(2, 0.5, np.float32),
                                                     "groups.0.head.bias": np.zeros(2)})
    assert strategy.reply_names(clients[0], [branch, "groups.0.head.bias"]) == \
        ["groups.0.head.bias"]
    assert sum(p.numel() for p in trained.values()) == TRAINED[0] - 2 * 2 * 2  # 4 FedAdapters


def test_grouped_aggregation_by_hand():
    cfg = resolve_config(CFG)
    clients = [ClientInfo(10 + i, i, 1, 10, f"c{i}", model_group=g)
               for i, g in enumerate([0, 0, 1])]
    one = lambda v: np.full((1, 1), v, np.float32)  # noqa: E731
    state = {"groups.0.x": one(0), "groups.1.x": one(0),
             "share.adapter.0.0.down": one(1), "share.adapter.0.1.down": one(1)}
    strategy = strategy_class(cfg)(cfg, clients, 3, state)
    assert strategy.client_payload(clients[0], ()) == [
        "groups.0.x", "share.adapter.0.0.down", "share.adapter.0.1.down"]
    assert strategy.reply_names(clients[2], strategy.client_payload(clients[2], ())) == [
        "groups.1.x", "share.adapter.0.1.down"]
    new = strategy.aggregate([
        ClientUpdate("0", {"groups.0.x": one(4), "share.adapter.0.0.down": one(5)}, 1),
        ClientUpdate("1", {"groups.0.x": one(8), "share.adapter.0.0.down": one(9)}, 3),
        ClientUpdate("2", {"groups.1.x": one(2), "share.adapter.0.1.down": one(3)}, 4)])
    assert new["groups.0.x"].item() == (1 * 4 + 3 * 8) / 4            # 7, group 0 only
    assert new["groups.1.x"].item() == 2                              # group 1 only
    # across all 8 examples; the group-1 client held branch 0 frozen at 1 (and vice versa)
    assert new["share.adapter.0.0.down"].item() == (1 * 5 + 3 * 9 + 4 * 1) / 8   # 4.5
    assert new["share.adapter.0.1.down"].item() == (1 * 1 + 3 * 1 + 4 * 3) / 8   # 2.0


def test_two_group_heterotune_run(tmp_path):
    folder = Path(run_inprocess({**CFG, "num-server-rounds": 2, "results-dir": str(tmp_path)}))
    metrics = json.loads((folder / "metrics.json").read_text())
    clients = json.loads((folder / "config.json").read_text())["clients"]
    groups = {str(c["partition_id"]): c["model_group"] for c in clients}
    assert sorted(groups.values()) == [0, 0, 1, 1]
    for m in metrics:
        assert m["trainable-params"] == {p: TRAINED[g] for p, g in groups.items()}
        assert set(m["accuracy-per-model-group"]) == {"0", "1"}
        counts = m["params-per-model-group"]
        assert [counts[g]["trainable-params"] for g in "01"] == [TRAINED[0], TRAINED[1]]
        # each client also receives the other group's frozen branch: 2 x (64 + 64)
        assert [counts[g]["received-params"] for g in "01"] == [TRAINED[0] + 256,
                                                               TRAINED[1] + 256]
        assert 0 < counts["0"]["reduction-%"] < 100
    # the saved global model is the fused one; it equals fusing the (unfused) checkpoint state
    saved = load_file(str(folder / "state.safetensors"))
    raw = {k.removeprefix("state/"): v
           for k, v in load_file(str(folder / "checkpoint.safetensors")).items()
           if k.startswith("state/")}
    expected = fuse_state(raw, [2, 3], 2)
    assert set(saved) == set(expected)
    for name, value in expected.items():  # the same numpy code on the same float32 state
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    assert saved["groups.0.blocks.1.mlp.fc2.adapter.A"].shape == (16, 8)
    assert saved["groups.1.blocks.2.mlp.fc2.adapter.B"].shape == (8, 32)
    # both groups trained their own share branch (moved away from the identity) ...
    # (weight decay only scales the identity: an off-diagonal entry moves by a gradient alone)
    for g in (0, 1):
        up = raw[f"share.adapter.0.{g}.up"]
        assert np.abs(up - np.diag(np.diag(up))).max() > 0
    initial = np.full(2, 0.5, np.float32)
    assert not np.allclose(raw["groups.1.blocks.0.mlp.fc2.adapter.branch"], initial)


def test_table2_parameter_counts_by_hand():
    from fedtune_app.tools.config_info import parameter_table

    rows = parameter_table(resolve_config(CFG))
    # ViT d=16, 2 blocks, 8x8 grey images in 2x2 patches, 10 classes: patch conv 4*16+16, cls 16,
    # pos (16+1)*16; per block 2 norms 2*32, qkv 16*48+48, proj 16*16+16, fc1 16*64+64,
    # fc2 64*16+16; final norm 32; head 170
    block = 64 + 816 + 272 + 1088 + 1040
    assert rows[0]["model-params"] == 80 + 16 + 272 + 2 * block + 32 + 170
    assert [r["trainable-params"] for r in rows] == [TRAINED[0], TRAINED[1]]
    assert [r["received-params"] - r["trainable-params"] for r in rows] == [256, 256]
    assert rows[0]["reduction-%"] == pytest.approx(100 * (1 - TRAINED[0] / rows[0]["model-params"]))


def test_within_group_sharing_keeps_every_group_to_its_own_share_adapters():
    # adapter-Homo: each group its own copy of the share bank, averaged over its clients only
    cfg = resolve_config(CFG | {"heterotune-sharing": "within-group"})
    clients = [ClientInfo(10 + i, i, 1, 10, f"c{i}", model_group=g)
               for i, g in enumerate([0, 0, 1])]
    one = lambda v: np.full((1, 1), v, np.float32)  # noqa: E731
    state = {f"groups.{g}.share.adapter.0.{i}.down": one(1) for g in (0, 1) for i in (0, 1)}
    strategy = strategy_class(cfg)(cfg, clients, 3, state)
    assert strategy.client_payload(clients[2], ()) == [
        "groups.1.share.adapter.0.0.down", "groups.1.share.adapter.0.1.down"]
    assert strategy.reply_names(clients[2], strategy.client_payload(clients[2], ())) == [
        "groups.1.share.adapter.0.1.down"]  # its own branch only
    new = strategy.aggregate([
        ClientUpdate("0", {"groups.0.share.adapter.0.0.down": one(5)}, 1),
        ClientUpdate("1", {"groups.0.share.adapter.0.0.down": one(9)}, 3),
        ClientUpdate("2", {"groups.1.share.adapter.0.1.down": one(3)}, 4)])
    assert new["groups.0.share.adapter.0.0.down"].item() == (1 * 5 + 3 * 9) / 4   # 8, group 0
    assert new["groups.1.share.adapter.0.1.down"].item() == 3                      # group 1
    # a branch no group of its copy trains stays at its start: nothing crosses groups
    assert new["groups.0.share.adapter.0.1.down"].item() == 1
    assert new["groups.1.share.adapter.0.0.down"].item() == 1


def test_within_group_run_never_mixes_the_groups_share_adapters(tmp_path):
    folder = Path(run_inprocess({**CFG, "heterotune-sharing": "within-group",
                                 "num-server-rounds": 2, "results-dir": str(tmp_path)}))
    raw = {k.removeprefix("state/"): v
           for k, v in load_file(str(folder / "checkpoint.safetensors")).items()
           if k.startswith("state/")}
    assert not any(n.startswith("share.") for n in raw)
    eye = np.eye(8, dtype=np.float32)
    for g, other in ((0, 1), (1, 0)):
        own = raw[f"groups.{g}.share.adapter.0.{g}.up"]
        assert np.abs(own - np.diag(np.diag(own))).max() > 0  # trained by its group
        # the other group's branch in this group's copy: never trained, never received
        np.testing.assert_array_equal(raw[f"groups.{g}.share.adapter.0.{other}.up"], eye)
    # the two groups' own branches differ: no value crossed
    assert not np.allclose(raw["groups.0.share.adapter.0.0.up"],
                           raw["groups.1.share.adapter.0.0.up"])
    saved = load_file(str(folder / "state.safetensors"))
    expected = fuse_state(raw, [2, 3], 2)
    for name, value in expected.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
