"""FedMD, FedDF, FlexiFed, pFedLoRA: the public set, the distillation and aggregation steps by
hand, and (with model groups) two rounds end to end."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedtune_app.data.splits import Examples, client_examples, public_split, run_splits
from fedtune_app.federated.aggregation import (
    ClientUpdate,
    keyed_weighted_mean,
    masked_weighted_mean,
)
from fedtune_app.methods import resolve_config
from fedtune_app.methods.flexifed import common_keys
from fedtune_app.training.distill import consensus, digest_loss, distill, indexed, kd_loss
from floats import FLOAT32_ROUNDING, assert_rounded_mean, float32_atol


def f32(*v):
    return np.array(v, dtype=np.float32)


# -- public set ---------------------------------------------------------------------------------

def test_public_set_is_stratified_and_nobodys_data():
    cfg = resolve_config({"preset": "smoke"})
    splits = run_splits(cfg)
    same, none = public_split(cfg.held_out, splits)
    assert same is splits.train and none is None  # other methods: all training data
    cfg = cfg.replace(**{"method": "fedmd", "public-fraction": 0.2})
    private, public = public_split(cfg.held_out, splits)
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
    # T^2 * sum of 2 terms p (log p - log q): each of the 4 float32 log-probabilities is within
    # 6 roundings (shift, exp, sum, log, subtraction, the 1/T) of |z| + log 2 <= 2, and p <= 1
    assert kd_loss(torch.zeros(1, 2), teacher, 2.0).item() == \
        pytest.approx(4 * kl, rel=0, abs=4 * 4 * 6 * 2 * FLOAT32_ROUNDING)
    assert kd_loss(teacher, teacher, 1.0).item() == pytest.approx(0, abs=1e-7)


class Constant(nn.Module):
    """Logits w for every input: the distillation gradient is easy to write down."""

    def __init__(self, classes):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(classes))

    def forward(self, x, plan=None):
        return self.w.expand(len(x), -1)


def test_distill_matches_each_public_example_to_its_own_target():
    training = resolve_config({"preset": "smoke"}).replace(**{
        "batch-size": 1, "momentum": 0.0, "weight-decay": 0.0, "grad-clip": 0.0}).training
    model = Constant(2)
    public = Examples(torch.zeros(2, 1), torch.tensor([7, 7]))
    targets = np.array([[1.0, -1.0], [1.0, 1.0]], dtype=np.float32)
    # L1 gradient of one example = sign(w - t) / 2. Either order: w -> [0.05, -+0.05] -> [0.1, 0]
    # (with a wrong target mapping, e.g. always row 0, w would end at [0.1, -0.1])
    distill(model, None, [model.w], public, targets, digest_loss, training, epochs=1, lr=0.1,
            seed=0, device=torch.device("cpu"))
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


def test_flexifed_basic_and_clustered_common_by_hand():
    # flexifed_state: groups 0 (2 blocks) and 1 (3 blocks) of one width, group 2 another width
    keys = {s: common_keys(flexifed_state(), s) for s in ("basic-common", "clustered-common")}
    # basic-common: no layer is common to ALL three (group 2 differs at block 0): none shared
    basic = keys["basic-common"]
    assert len({basic[f"groups.{g}.blocks.0.a"] for g in (0, 1, 2)}) == 3
    # clustered-common: {0, 1} (same first layer) share their common prefix, blocks 0 and 1
    clustered = keys["clustered-common"]
    assert clustered["groups.0.blocks.1.a"] == clustered["groups.1.blocks.1.a"]
    assert clustered["groups.2.blocks.0.a"] != clustered["groups.0.blocks.0.a"]
    # one width, depths 2, 3, 4: max-common lets 3 and 4 share block 2 as well; clustered
    # (and basic) share only the prefix all three have, blocks 0 and 1
    z = f32(0, 0)
    state = {f"groups.{g}.blocks.{j}.a": z for g, depth in enumerate((2, 3, 4))
             for j in range(depth)}
    most = common_keys(state, "max-common")
    assert most["groups.1.blocks.2.a"] == most["groups.2.blocks.2.a"]
    for strategy in ("basic-common", "clustered-common"):
        keys = common_keys(state, strategy)
        assert len({keys[f"groups.{g}.blocks.1.a"] for g in range(3)}) == 1
        assert keys["groups.1.blocks.2.a"] != keys["groups.2.blocks.2.a"]


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
    # each output sums 2 base products, the bias and 2 * 2 * 2 LoRA products of x, A, C, B and
    # the scale 2, in another order than the layer: 11 terms of at most 5 factors, each <= m
    m = max(1.0, *(t.abs().max().item() for t in (x, A, C, B, base.weight, base.bias)))
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=float32_atol(m, m, m, m, 2.0,
                                                                             terms=11))


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


# -- over model groups: server steps on real models, two rounds end to end ---------------------

VIT = "img_size=8,patch_size=2,in_chans=1,num_heads=2"
# two groups of tiny random-init ViTs: widths 16 / 32, depths 2 / 3 (as the model-groups tests)
TWO_GROUPS = {"preset": "smoke", "model-groups": "vit_tiny_patch16_224",
              "model-group-args": f"{VIT},embed_dim=16,depth=2;{VIT},embed_dim=32,depth=3",
              "model-group-sources": "random", "capacities": "1,1,1,1",
              "model-group-ratio": "1:1", "num-server-rounds": 2}
SAME_WIDTH = TWO_GROUPS | {
    "model-group-args": f"{VIT},embed_dim=16,depth=2;{VIT},embed_dim=16,depth=3"}


def run_recording(keys, tmp_path):
    """Run in process; returns (results folder, train messages sent, replies per round)."""
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
    from fedtune_app.apps.server import run_federation
    from fedtune_app.data.scenarios import num_clients
    from fedtune_app.federated.strategy import from_record
    from fedtune_app.federated.wire import TrainReply, TrainTask

    rc = {**keys, "results-dir": str(tmp_path)}
    cfg = resolve_config(rc)
    replies = {}

    def record(msg, reply):
        if msg.metadata.message_type == "train":
            answer = TrainReply.from_message(reply)
            replies.setdefault(TrainTask.from_message(msg).server_round, []).append(
                (from_record(answer.arrays), int(answer.num_examples)))
        return reply

    n = num_clients(cfg)
    grid = InProcessGrid(client_app, simulation_nodes(n), rc, faults={i: record for i in range(n)})
    folder = Path(run_federation(grid, cfg))
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    return folder, train, replies, cfg


def results(folder):
    from safetensors.numpy import load_file

    return (json.loads((folder / "metrics.json").read_text()),
            load_file(str(folder / "state.safetensors")))


def test_fedmd_two_rounds_consensus_is_the_mean_of_the_scores(tmp_path):
    from fedtune_app.methods.fedmd import CONSENSUS

    folder, train, replies, cfg = run_recording({**TWO_GROUPS, "method": "fedmd"}, tmp_path)
    metrics, state = results(folder)
    assert [m["round"] for m in metrics] == [1, 2] and not any(m["rejected"] for m in metrics)
    public = public_split(cfg.held_out, run_splits(cfg))[1]
    shape = (len(public), 10)
    round1 = [t[CONSENSUS] for t, _ in replies[1]]
    assert all(s.shape == shape for s in round1) and len(round1) == 4
    # round 2 sends every client the plain mean of the round-1 scores
    sent2 = [from_message(m)[CONSENSUS] for m in train if task(m).server_round == 2]
    for sent in sent2:
        assert_rounded_mean(sent, round1)
    assert_rounded_mean(state[CONSENSUS], [t[CONSENSUS] for t, _ in replies[2]])
    # honest bytes: each message carries the P x C scores besides the group's tensors
    scores_bytes = 4 * shape[0] * shape[1]
    params = {p: n for p, n in metrics[0]["trainable-params"].items()}
    assert metrics[0]["bytes-down"] >= sum(4 * n + scores_bytes for n in params.values())
    assert metrics[0]["bytes-up"] >= sum(4 * n + scores_bytes for n in params.values())
    # ... plus each Array's own metadata (name, dtype, shape), well under 256 bytes
    arrays = sum(len(task(m).arrays) for m in train if task(m).server_round == 1)
    assert metrics[0]["bytes-down"] < sum(4 * n + scores_bytes for n in params.values()) + \
        256 * arrays
    assert set(metrics[-1]["accuracy-per-model-group"]) == {"0", "1"}


def task(msg):
    from fedtune_app.federated.wire import TrainTask

    return TrainTask.from_message(msg)


def from_message(msg):
    from fedtune_app.federated.strategy import from_record

    return from_record(task(msg).arrays)


def test_flexifed_two_rounds_shares_the_common_prefix_only(tmp_path):
    folder, _, replies, _ = run_recording({**SAME_WIDTH, "method": "flexifed"}, tmp_path)
    metrics, state = results(folder)
    assert not any(m["rejected"] for m in metrics)
    blocks01 = [n for n in state if n.startswith("groups.0.blocks.")]
    assert blocks01 and all(n.split(".")[3] in "01" for n in blocks01)
    for name in blocks01:  # blocks 0-1: one value for both groups, the mean over all 4 clients
        twin = name.replace("groups.0.", "groups.1.", 1)
        np.testing.assert_array_equal(state[name], state[twin])
        sent = [(t[n], k) for t, k in replies[2] for n in (name, twin) if n in t]
        assert len(sent) == 4
        assert_rounded_mean(state[name], *zip(*sent))
    # the heads follow different depths: each the mean of its own group's clients
    head0 = [(t["groups.0.head.weight"], k) for t, k in replies[2] if "groups.0.head.weight" in t]
    assert len(head0) == 2
    assert_rounded_mean(state["groups.0.head.weight"], *zip(*head0))
    assert not np.allclose(state["groups.0.head.weight"][:, :16], state["groups.1.head.weight"])


def test_pfedlora_two_rounds_homogeneous_adapters_shared_across_widths(tmp_path):
    folder, _, replies, _ = run_recording({**TWO_GROUPS, "method": "pfedlora"}, tmp_path)
    metrics, state = results(folder)
    assert not any(m["rejected"] for m in metrics)
    core = "mlp.fc2.lora_C.weight"
    # K = 2 positions: group 0 blocks 0, 1 -> 0, 1; group 1 blocks 0, 1 -> 0 and block 2 -> 1
    np.testing.assert_array_equal(state[f"groups.0.blocks.0.{core}"],
                                  state[f"groups.1.blocks.0.{core}"])
    np.testing.assert_array_equal(state[f"groups.1.blocks.1.{core}"],
                                  state[f"groups.1.blocks.0.{core}"])
    np.testing.assert_array_equal(state[f"groups.0.blocks.1.{core}"],
                                  state[f"groups.1.blocks.2.{core}"])
    assert state[f"groups.0.blocks.0.{core}"].shape == (8, 8)
    assert not np.allclose(state[f"groups.0.blocks.0.{core}"], np.eye(8))  # trained, from I
    assert state["groups.0.blocks.0.mlp.fc2.lora_A.weight"].shape == (8, 64)  # own width
    assert state["groups.1.blocks.0.mlp.fc2.lora_A.weight"].shape == (8, 128)
    # per client: A, C, B of attn.proj (d -> d) and of mlp.fc2 (4d -> d) of each block + head
    per_group = {0: 2 * (8 * 16 + 64 + 16 * 8 + 8 * 64 + 64 + 16 * 8) + 16 * 10 + 10,
                 1: 3 * (8 * 32 + 64 + 32 * 8 + 8 * 128 + 64 + 32 * 8) + 32 * 10 + 10}
    assert sorted(set(metrics[0]["trainable-params"].values())) == sorted(per_group.values())


def test_feddf_server_distillation_on_real_group_models():
    from fedtune_app.apps.evaluation import build_global
    from fedtune_app.federated.strategy import ClientInfo, RoundLog
    from fedtune_app.methods.feddf import FedDF

    cfg = resolve_config({**TWO_GROUPS, "method": "feddf", "distill-epochs": 2,
                          "feddf-distillation": "epochs"})
    model, recipe = build_global(cfg)
    state = recipe.initial_state(model, 0)
    clients = [ClientInfo(10 + i, i, 1, 10 * (i + 1), f"c{i}", model_group=g)
               for i, g in enumerate([0, 0, 1])]
    rng = np.random.default_rng(1)
    updates = [ClientUpdate(str(c.partition_id),
                            {n: (v + rng.normal(0, 0.3, v.shape)).astype(np.float32)
                             for n, v in state.items() if n.startswith(f"groups.{c.model_group}.")},
                            c.num_examples) for c in clients]
    mean = masked_weighted_mean(state, updates)

    def aggregate(**keys):
        strategy = FedDF(cfg.replace(**keys), clients, 3, state)
        strategy.attach(model, recipe)
        strategy.history.append(RoundLog(1))
        return strategy.aggregate(updates), strategy.public

    same, public = aggregate(**{"distill-lr": 0.0})  # no step: FedDF's fusion start, x_g
    assert all(np.array_equal(same[n], mean[n]) for n in state)
    # the teacher: the mean of the three client models' logits on the public set
    from fedtune_app.training.distill import scores_on

    device = torch.device("cpu")
    logits = []
    for c, u in zip(clients, updates):
        recipe.recipes[c.model_group].load(model.groups[c.model_group], mean | u.tensors)
        plan = tuple(range(model.groups[c.model_group].num_blocks))
        logits.append(scores_on(model.groups[c.model_group], plan, public, 64, device))
    teacher = torch.as_tensor(np.mean(logits, axis=0))

    def distance(s, g):  # KL(teacher || group g's model) on the public set
        recipe.recipes[g].load(model.groups[g], s)
        plan = tuple(range(model.groups[g].num_blocks))
        z = torch.as_tensor(scores_on(model.groups[g], plan, public, 64, device))
        return kd_loss(z, teacher, 1.0).item()

    new, _ = aggregate(**{"distill-lr": 0.05})
    for g in (0, 1):
        assert distance(new, g) < distance(mean, g)  # distilled towards the ensemble
        assert any(not np.array_equal(new[n], mean[n]) for n in state
                   if n.startswith(f"groups.{g}."))


class Scalar(nn.Module):
    """logits = [w, 0] for every example: one trainable number."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, x, plan):
        return torch.stack([self.w.expand(len(x)), torch.zeros(len(x))], -1)


def test_feddf_distillation_runs_its_steps_with_adam_and_cosine_annealing():
    from fedtune_app.training.distill import distill_steps

    model, public = Scalar(), Examples(torch.zeros(5, 1), torch.zeros(5, dtype=torch.long))
    seen = []

    def loss(z, t):  # d/dw = 1 for every batch: Adam's first step moves w by -lr exactly
        seen.append(len(z))
        return z[:, 0].mean()

    taken = distill_steps(model, (), [model.w], public, np.zeros((5, 2)), loss, steps=7,
                          lr=0.1, batch_size=2, seed=0, device=torch.device("cpu"))
    # 5 examples in batches of 2: passes of 2, 2, 1 examples, reshuffled, until 7 steps
    assert taken == 7 and seen == [2, 2, 1, 2, 2, 1, 2]
    # constant gradient: every Adam step is -lr_t (m/sqrt(v) = 1, eps aside), lr_t cosine
    lrs = [0.1 * (1 + math.cos(math.pi * t / 7)) / 2 for t in range(7)]
    assert model.w.item() == pytest.approx(-sum(lrs), rel=1e-6)


def test_feddf_early_stopping_keeps_the_best_validated_model():
    from fedtune_app.training.distill import distill_steps

    model, public = Scalar(), Examples(torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))
    accuracies = iter([0.1, 0.5, 0.7, 0.6, 0.7, 0.9])  # at steps 0, 1, 2, 3, 4, 5
    values = []

    def validate():
        values.append(model.w.item())
        return next(accuracies)

    taken = distill_steps(model, (), [model.w], public, np.zeros((4, 2)),
                          lambda z, t: z[:, 0].mean(), steps=50, lr=0.1, batch_size=4,
                          seed=0, device=torch.device("cpu"), validate=validate,
                          eval_every=1, patience=2)
    # best 0.7 at step 2; steps 3 and 4 do not beat it: 2 steps of patience, stop at 4
    assert taken == 4
    assert model.w.item() == values[2]  # the parameters validated at step 2 are kept
    assert values[4] < values[2]  # (they did move on meanwhile)


def test_feddf_defaults_are_its_papers():
    # without the smoke preset, whose budget is smoke-sized (20 steps)
    cfg = resolve_config({k: v for k, v in TWO_GROUPS.items() if k != "preset"}
                         | {"method": "feddf"})
    assert (cfg.own.feddf_distillation, cfg.own.feddf_lr, cfg.own.feddf_steps,
            cfg.own.feddf_patience, cfg.own.feddf_val_fraction) == ("paper", 1e-3, 10_000, 1000,
                                                                    0.1)


def test_feddf_two_rounds_end_to_end(tmp_path):
    folder, _, replies, _ = run_recording({**TWO_GROUPS, "method": "feddf", "feddf-steps": 7,
                                           "feddf-val-fraction": 0}, tmp_path)
    metrics, state = results(folder)
    assert [m["round"] for m in metrics] == [1, 2] and not any(m["rejected"] for m in metrics)
    assert set(metrics[-1]["accuracy-per-model-group"]) == {"0", "1"}
    # the state is the distilled one, not the plain group mean of the last replies
    head = [(t["groups.0.head.weight"], k) for t, k in replies[2] if "groups.0.head.weight" in t]
    mean = sum(v.astype(np.float64) * k for v, k in head) / sum(k for _, k in head)
    assert not np.allclose(state["groups.0.head.weight"], mean)


@pytest.mark.parametrize("keys, epochs", [({}, [3, 3]),
                                          ({"pfedlora-model-epochs": 2,
                                            "pfedlora-adapter-epochs": 5}, [2, 5])])
def test_pfedlora_phase_lengths(keys, epochs):
    from fedtune_app.data.groups import group_config
    from fedtune_app.methods import recipe_for
    from fedtune_app.model.backbones import ModelSpec

    cfg = resolve_config({**TWO_GROUPS, "method": "pfedlora", "local-epochs": 3,
                          "batch-size": 4, **keys})
    recipe = recipe_for(cfg, 0)
    model = recipe.build(ModelSpec.from_config(group_config(cfg, 0).model, 10))
    plan = tuple(range(model.num_blocks))
    params = recipe.trainables(model, plan)
    cores = [p for n, p in params.items() if ".lora_C." in n]
    data = run_splits(cfg).train.subset(range(4))  # 4 examples, batch 4: one step per epoch
    steps = []  # per optimizer step: does C train in it?

    def loss_fn(inputs, labels):
        steps.append(cores[0].requires_grad)
        return nn.functional.cross_entropy(model(inputs, plan), labels)

    recipe.fit(model, plan, params, data, seed=0, device=torch.device("cpu"),
               loss_fn=loss_fn, server_round=1)
    # phase 1: the local part with C frozen; phase 2: C alone
    assert steps == [False] * epochs[0] + [True] * epochs[1]


def test_pfedlora_shared_passes_make_one_pass_a_round():
    from fedtune_app.data.groups import group_config
    from fedtune_app.methods import recipe_for
    from fedtune_app.model.backbones import ModelSpec

    cfg = resolve_config({**TWO_GROUPS, "method": "pfedlora", "local-epochs": 1,
                          "batch-size": 1, "pfedlora-passes": "shared"})
    recipe = recipe_for(cfg, 0)
    model = recipe.build(ModelSpec.from_config(group_config(cfg, 0).model, 10))
    plan = tuple(range(model.num_blocks))
    params = recipe.trainables(model, plan)
    cores = [p for n, p in params.items() if ".lora_C." in n]
    data = run_splits(cfg).train.subset(range(5))  # batch 1: one step per example
    steps = []

    def loss_fn(inputs, labels):
        steps.append(cores[0].requires_grad)
        return nn.functional.cross_entropy(model(inputs, plan), labels)

    recipe.fit(model, plan, params, data, seed=0, device=torch.device("cpu"),
               loss_fn=loss_fn, server_round=1)
    # 5 examples, one pass in all: 2 with C frozen (the first half), then 3 training C
    assert steps == [False] * 2 + [True] * 3


def test_fedmd_whole_models_send_whole_model_tensors(tmp_path):
    from fedtune_app.methods.fedmd import CONSENSUS

    folder, _, replies, cfg = run_recording({**TWO_GROUPS, "method": "fedmd",
                                             "client-trains": "heterotune"}, tmp_path)
    assert cfg.adapter.client_trains == "full"
    metrics, _ = results(folder)
    assert not any(m["rejected"] for m in metrics)
    for tensors, _ in replies[2]:
        names = set(tensors) - {CONSENSUS}
        assert not any("lora_" in n for n in names)  # no adapters: the weights themselves
        g = next(iter(names)).split(".")[1]
        assert f"groups.{g}.blocks.0.mlp.fc2.weight" in names
        assert f"groups.{g}.patch_embed.proj.weight" in names or any(
            ".blocks.0.attn.qkv.weight" in n for n in names)
    # the adapter reading stays a key
    assert resolve_config({**TWO_GROUPS, "method": "fedmd"}).adapter.client_trains == "adapters"
