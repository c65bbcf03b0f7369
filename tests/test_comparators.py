"""FedMD, FedDF, FlexiFed, pFedLoRA: the public set, the distillation and aggregation steps by
hand, and (with model groups) two rounds end to end."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedtune_app.aggregation import ClientUpdate, keyed_weighted_mean, masked_weighted_mean
from fedtune_app.config import resolve_config
from fedtune_app.data import Examples, client_examples, load_data
from fedtune_app.distill import (consensus, digest_loss, distill, indexed, kd_loss,
                                 public_split)
from fedtune_app.methods.flexifed import common_keys


def f32(*v):
    return np.array(v, dtype=np.float32)


# -- public set ---------------------------------------------------------------------------------

def test_public_set_is_stratified_and_nobodys_data():
    cfg = resolve_config({"preset": "smoke"})
    splits = load_data(cfg)
    same, none = public_split(cfg, splits)
    assert same is splits.train and none is None  # other methods: all training data
    cfg = cfg | {"method": "fedmd", "public-fraction": 0.2}
    private, public = public_split(cfg, splits)
    labels = splits.train.labels.numpy()
    expected = sum(round(0.2 * (labels == c).sum()) for c in range(10))
    assert len(public) == expected and len(private) + len(public) == len(splits.train)
    for c in range(10):  # every class keeps its 20% share
        assert (public.labels.numpy() == c).sum() == round(0.2 * (labels == c).sum())
    # the clients' partitions come from the private rest only: no public input is anyone's
    public_rows = {tuple(x.flatten().tolist()) for x in public.inputs}
    for pid in range(3):
        mine = client_examples(cfg, splits, pid, 3)
        assert not public_rows & {tuple(x.flatten().tolist()) for x in mine.inputs}


# -- distillation steps -------------------------------------------------------------------------

def test_fedmd_consensus_and_digest_loss_by_hand():
    np.testing.assert_allclose(consensus([f32(1, 2), f32(3, 6)]), [2, 4])
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    target = torch.tensor([[0.0, 2.0], [3.0, 6.0]])
    assert digest_loss(logits, target).item() == pytest.approx((1 + 0 + 0 + 2) / 4)


def test_feddf_kd_loss_by_hand():
    # teacher/T = [0, ln 3] -> p = [1/4, 3/4]; student [0, 0] -> q = [1/2, 1/2]
    teacher = torch.tensor([[0.0, 2 * math.log(3)]])
    kl = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kd_loss(torch.zeros(1, 2), teacher, 2.0).item() == pytest.approx(4 * kl, rel=1e-6)
    assert kd_loss(teacher, teacher, 1.0).item() == pytest.approx(0, abs=1e-7)


class Constant(nn.Module):
    """Logits w for every input: the distillation gradient is easy to write down."""

    def __init__(self, classes):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(classes))

    def forward(self, x, plan=None):
        return self.w.expand(len(x), -1)


def test_distill_matches_each_public_example_to_its_own_target():
    cfg = resolve_config({"preset": "smoke"}) | {
        "distill-epochs": 1, "distill-lr": 0.1, "batch-size": 1, "momentum": 0.0,
        "weight-decay": 0.0, "grad-clip": 0.0}
    model = Constant(2)
    public = Examples(torch.zeros(2, 1), torch.tensor([7, 7]))
    targets = np.array([[1.0, -1.0], [1.0, 1.0]], dtype=np.float32)
    # L1 gradient of one example = sign(w - t) / 2. Either order: w -> [0.05, -+0.05] -> [0.1, 0]
    # (with a wrong target mapping, e.g. always row 0, w would end at [0.1, -0.1])
    distill(model, None, [model.w], public, targets, digest_loss, cfg, seed=0,
            device=torch.device("cpu"))
    np.testing.assert_allclose(model.w.detach().numpy(), [0.1, 0.0], atol=1e-7)
    assert indexed(public).labels.tolist() == [0, 1]


# -- FlexiFed Max-Common ------------------------------------------------------------------------

def flexifed_state():
    """group 0: 2 blocks, group 1: 3 blocks of the same width, group 2: another width."""
    z2, z3, z4 = f32(0, 0), f32(0, 0, 0), f32(0, 0, 0, 0)
    return {"groups.0.blocks.0.a": z2, "groups.0.blocks.1.a": z2, "groups.0.head.w": z3,
            "groups.1.blocks.0.a": z2, "groups.1.blocks.1.a": z2, "groups.1.blocks.2.a": z2,
            "groups.1.head.w": z3,
            "groups.2.blocks.0.a": z4, "groups.2.head.w": z3}


def test_flexifed_common_prefix_classes():
    keys = common_keys(flexifed_state())
    assert keys["groups.0.blocks.0.a"] == keys["groups.1.blocks.0.a"]
    assert keys["groups.0.blocks.1.a"] == keys["groups.1.blocks.1.a"]
    # the head follows 2 blocks in group 0 and 3 in group 1: a different layer, not shared
    assert len({keys["groups.0.head.w"], keys["groups.1.head.w"], keys["groups.2.head.w"],
                keys["groups.1.blocks.2.a"], keys["groups.0.blocks.0.a"],
                keys["groups.2.blocks.0.a"]}) == 6
    # identical architectures share everything, the head included
    twins = {"groups.0.blocks.0.a": f32(0), "groups.0.head.w": f32(0, 0),
             "groups.1.blocks.0.a": f32(0), "groups.1.head.w": f32(0, 0)}
    keys = common_keys(twins)
    assert keys["groups.0.head.w"] == keys["groups.1.head.w"]


def test_flexifed_max_common_mean_by_hand():
    state = flexifed_state()
    updates = [
        ClientUpdate("0", {"groups.0.blocks.0.a": f32(1, 1), "groups.0.blocks.1.a": f32(2, 2),
                           "groups.0.head.w": f32(1, 1, 1)}, 10),
        ClientUpdate("1", {"groups.1.blocks.0.a": f32(5, 5), "groups.1.blocks.1.a": f32(6, 2),
                           "groups.1.blocks.2.a": f32(7, 7), "groups.1.head.w": f32(3, 3, 3)},
                     30),
        ClientUpdate("2", {"groups.2.blocks.0.a": f32(1, 2, 3, 4)}, 20),
    ]
    new = keyed_weighted_mean(state, updates, common_keys(state))
    for g in (0, 1):  # shared prefix: (10 * x_0 + 30 * x_1) / 40 in both groups
        np.testing.assert_allclose(new[f"groups.{g}.blocks.0.a"], [4, 4])
        np.testing.assert_allclose(new[f"groups.{g}.blocks.1.a"], [5, 2])
    np.testing.assert_allclose(new["groups.1.blocks.2.a"], [7, 7])  # group 1's own
    np.testing.assert_allclose(new["groups.0.head.w"], [1, 1, 1])
    np.testing.assert_allclose(new["groups.1.head.w"], [3, 3, 3])
    np.testing.assert_allclose(new["groups.2.blocks.0.a"], [1, 2, 3, 4])
    np.testing.assert_array_equal(new["groups.2.head.w"], [0, 0, 0])  # nobody sent it
    assert new["groups.0.blocks.0.a"].dtype == np.float32
    # keys = names: the plain masked mean
    same = keyed_weighted_mean(state, updates, {n: n for n in state})
    plain = masked_weighted_mean(state, updates)
    assert all(np.array_equal(same[n], plain[n]) for n in state)


# -- pFedLoRA -----------------------------------------------------------------------------------

def test_core_lora_forward_is_the_formula():
    from fedtune_app.methods.pfedlora import CoreLoRA

    torch.manual_seed(0)
    base = nn.Linear(2, 3)
    layer = CoreLoRA(base, r=2, alpha=4.0, dropout=0.0)
    A, C, B = torch.randn(2, 2), torch.randn(2, 2), torch.randn(3, 2)
    with torch.no_grad():
        layer.lora_A.weight.copy_(A), layer.lora_C.weight.copy_(C), layer.lora_B.weight.copy_(B)
    x = torch.randn(5, 2)
    expected = x @ base.weight.T + base.bias + (4.0 / 2) * x @ A.T @ C.T @ B.T
    torch.testing.assert_close(layer(x), expected)


def test_pfedlora_shares_homogeneous_adapters_by_relative_depth():
    from fedtune_app.methods.pfedlora import core_position, identity_cores, pfedlora_keys

    # K = 2 positions (smallest depth); a 3-block model: blocks 0, 1 -> 0, block 2 -> 1
    assert [core_position(j, 3, 2) for j in range(3)] == [0, 0, 1]
    assert [core_position(j, 2, 2) for j in range(2)] == [0, 1]
    one = f32(0).reshape(1, 1)
    state = {f"groups.{g}.blocks.{j}.fc.{t}.weight": one
             for g, depth in ((0, 2), (1, 3)) for j in range(depth) for t in ("lora_A", "lora_C")}
    assert identity_cores(state)["groups.1.blocks.2.fc.lora_C.weight"].tolist() == [[1.0]]
    assert identity_cores(state)["groups.1.blocks.2.fc.lora_A.weight"].tolist() == [[0.0]]
    keys = pfedlora_keys(state, [2, 3])

    def v(x):
        return np.array([[x]], dtype=np.float32)

    updates = [ClientUpdate("0", {"groups.0.blocks.0.fc.lora_C.weight": v(1),
                                  "groups.0.blocks.1.fc.lora_C.weight": v(2),
                                  "groups.0.blocks.0.fc.lora_A.weight": v(5)}, 10),
               ClientUpdate("1", {"groups.1.blocks.0.fc.lora_C.weight": v(3),
                                  "groups.1.blocks.1.fc.lora_C.weight": v(5),
                                  "groups.1.blocks.2.fc.lora_C.weight": v(6),
                                  "groups.1.blocks.0.fc.lora_A.weight": v(7)}, 30)]
    new = keyed_weighted_mean(state, updates, keys)
    k0 = (10 * 1 + 30 * 3 + 30 * 5) / 70  # position 0: g0 block 0, g1 blocks 0 and 1
    for name in ("groups.0.blocks.0", "groups.1.blocks.0", "groups.1.blocks.1"):
        np.testing.assert_allclose(new[f"{name}.fc.lora_C.weight"], [[k0]], rtol=1e-6)
    for name in ("groups.0.blocks.1", "groups.1.blocks.2"):  # position 1: (10*2 + 30*6) / 40
        np.testing.assert_allclose(new[f"{name}.fc.lora_C.weight"], [[5]])
    np.testing.assert_allclose(new["groups.0.blocks.0.fc.lora_A.weight"], [[5]])  # own group
    np.testing.assert_allclose(new["groups.1.blocks.0.fc.lora_A.weight"], [[7]])
    np.testing.assert_array_equal(new["groups.1.blocks.2.fc.lora_A.weight"], [[0]])  # not sent
