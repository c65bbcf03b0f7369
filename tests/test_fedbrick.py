"""FedBRICK: the BRICK formula, stage I/II losses and mixing, server distillation, the proxy
split, per-domain aggregation, and a 2-round run over two domains."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import TINY_VIT
from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.data.splits import client_examples, proxy_indices, run_splits
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.strategy import ClientInfo, RoundLog
from fedtune_app.methods import resolve_config
from fedtune_app.methods.fedbrick import (
    Brick,
    FedBRICK,
    FedBRICKRecipe,
    anneal,
    block_io,
    distill_bricks,
    forward_with_bricks,
    layer_mse,
)
from fedtune_app.model.adapters import AdapterSpec, attach_adapters
from fedtune_app.model.backbones import build_backbone
from floats import FLOAT32_ROUNDING, NETWORK_FLOAT64_ATOL, float32_atol

TWO_DOMAINS = {"preset": "offline-feature-skew", "model-source": "random",
               "domains": "original,inverted", "capacities": "4,2"}


def tiny_model(cfg):
    """TINY_VIT (4 blocks, d = 32) with LoRA r=8 on mlp.fc2 and the recipe's BRICKs."""
    recipe = FedBRICKRecipe(cfg)
    return recipe, recipe.extend(attach_adapters(build_backbone(TINY_VIT), AdapterSpec()))


@pytest.fixture(scope="module")
def setup():
    cfg = resolve_config({"preset": "smoke", "method": "fedbrick"})
    recipe, model = tiny_model(cfg)
    model.eval()  # LoRA dropout off: forwards are deterministic
    torch.manual_seed(0)
    with torch.no_grad():  # non-trivial BRICKs and adapters
        for p in model.bricks.parameters():
            p.normal_(0, 0.1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    images = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 3, 1, 9, 3])
    return cfg, recipe, model, images, labels


# -- the BRICK ----------------------------------------------------------------------------------

def test_brick_forward_equals_the_formula():
    brick = Brick(d=2, r=1)
    with torch.no_grad():
        brick.A1.copy_(torch.tensor([[1.0, 0.0]]))  # x1 = B1 A1 x = (x_0, -x_0)
        brick.B1.copy_(torch.tensor([[1.0], [-1.0]]))
        brick.A2.copy_(torch.tensor([[0.0, 1.0]]))  # x2 = B2 A2 x = (2 x_1, 0)
        brick.B2.copy_(torch.tensor([[2.0], [0.0]]))
    x = torch.tensor([[[1.0, 2.0], [0.0, -1.0]]])  # (batch 1, 2 tokens, d 2)
    s = 1 / (1 + math.exp(-2))  # softmax((1, -1))[0]
    expected = [1 * s + 4 + 1, 2 * (1 - s) + 0 + 2,  # token (1, 2): softmax((1, -1))
                0 * 0.5 - 2 + 0, -1 * 0.5 + 0 - 1]  # token (0, -1): softmax((0, 0)) = 1/2
    assert brick(x).flatten().tolist() == pytest.approx(expected)


def test_brick_has_4rd_parameters_and_the_model_one_per_domain_and_position(setup):
    assert sum(p.numel() for p in Brick(d=32, r=8).parameters()) == 4 * 8 * 32
    cfg = resolve_config({**TWO_DOMAINS, "method": "fedbrick", "fedbrick-rank": 3})
    _, model = tiny_model(cfg)
    names = [n for n, _ in model.named_parameters() if n.startswith("bricks.")]
    assert len(names) == 2 * 4 * 4  # domains x positions x (A1, B1, A2, B2)
    assert "bricks.inverted.3.B2" in names
    assert sum(p.numel() for p in model.bricks.parameters()) == 2 * 4 * (4 * 3 * 32)


def test_a_fresh_brick_is_identity_up_to_one_over_d():
    cfg = resolve_config({**TWO_DOMAINS, "method": "fedbrick", "seed": 3})
    names = {f"bricks.original.0.{t}": np.zeros(s, np.float32)
             for t, s in (("A1", (8, 32)), ("B1", (32, 8)), ("A2", (8, 32)), ("B2", (32, 8)))}
    info = [ClientInfo(1, 0, 4, 10, "original"), ClientInfo(2, 1, 2, 10, "inverted")]
    state = FedBRICK(cfg, info, 4, names | {"head.weight": np.zeros((10, 32), np.float32)}).state
    brick = Brick(32, 8)
    brick.load_state_dict({k.rsplit(".", 1)[1]: torch.from_numpy(v) for k, v in state.items()
                           if k.startswith("bricks.")})
    a1 = state["bricks.original.0.A1"]
    assert a1.std() > 0 and np.abs(a1).max() <= 1 / math.sqrt(32)
    x = torch.randn(2, 3, 32)
    # elementwise, no sums: both sides are x * 33/32 after at most three roundings relative to
    # the element itself (softmax's 1/32, the product, the sum), so rtol alone holds near 0 too
    torch.testing.assert_close(brick(x), x * (1 + 1 / 32), rtol=3 * FLOAT32_ROUNDING, atol=0)
    assert not state["head.weight"].any()  # other tensors untouched


# -- client: stage I and stage II ---------------------------------------------------------------

def in_float64(model, images):
    """A float64 copy of the fixture's model and images: the forwards composed in these tests
    and the recipe's are different code, so only rounding may separate them."""
    return copy.deepcopy(model).double(), images.double()


def test_stage_one_forward_fills_missing_positions_with_bricks(setup):
    cfg, recipe, model, images, _ = setup
    model, images = in_float64(model, images)
    bricks = model.bricks["all"]
    x, ctx = model.embed(images)
    x = bricks["3"](model.blocks[2](bricks["1"](bricks["0"](x))))  # plan (2,): 0, 1, 3 missing
    logits, pairs = forward_with_bricks(model, (2,), bricks, images)
    torch.testing.assert_close(logits, model.classify(x, ctx), rtol=0, atol=NETWORK_FLOAT64_ATOL)
    assert pairs == []


def test_stage_two_mixes_retained_blocks_with_their_bricks(setup):
    cfg, recipe, model, images, _ = setup
    model, images = in_float64(model, images)
    bricks, alpha = model.bricks["all"], 0.25
    x, ctx = model.embed(images)
    x = bricks["0"](x)
    a1 = 0.25 * model.blocks[1](x) + 0.75 * bricks["1"](x)
    a2 = bricks["2"](a1)
    a3 = 0.25 * model.blocks[3](a2) + 0.75 * bricks["3"](a2)
    logits, pairs = forward_with_bricks(model, (1, 3), bricks, images, alpha)
    for got, expected in ((logits, model.classify(a3, ctx)), (pairs[0][0], bricks["1"](x)),
                          (pairs[0][1], model.blocks[1](x)), (pairs[1][0], bricks["3"](a2))):
        torch.testing.assert_close(got, expected, rtol=0, atol=NETWORK_FLOAT64_ATOL)


def test_bricks_on_the_text_encoder(tiny_bert_dir):
    """BERT blocks take (batch, tokens, d) with the attention-mask context: at alpha = 1 with
    every block held, stage II's forward is the plain model; a missing block runs its BRICK."""
    from fedtune_app.model.backbones import ModelSpec

    cfg = resolve_config({"preset": "smoke", "method": "fedbrick", "fedbrick-rank": 2})
    model = FedBRICKRecipe(cfg).extend(attach_adapters(
        build_backbone(ModelSpec(tiny_bert_dir, "random", "", 5, 3)), AdapterSpec()))
    model.eval().double()  # float64: see in_float64
    assert sum(p.numel() for p in model.bricks["all"]["0"].parameters()) == 4 * 2 * 16
    ids = torch.randint(1, 100, (3, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    bricks = model.bricks["all"]
    with torch.no_grad():
        logits, pairs = forward_with_bricks(model, (0, 1, 2), bricks, inputs, alpha=1.0)
        torch.testing.assert_close(logits, model(inputs), rtol=0, atol=NETWORK_FLOAT64_ATOL)
        assert len(pairs) == 3
        x, ctx = model.embed(inputs)
        x = model.run_block(model.blocks[2], bricks["1"](model.run_block(model.blocks[0], x, ctx)),
                            ctx)
        torch.testing.assert_close(forward_with_bricks(model, (0, 2), bricks, inputs)[0],
                                   model.classify(x, ctx), rtol=0, atol=NETWORK_FLOAT64_ATOL)


def test_annealing_schedule():
    assert [anneal(e, 4) for e in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_stage_one_loss_terms(setup):
    cfg, recipe, model, images, labels = setup
    plan = (0, 2)
    recipe.configure({"layers": list(plan), "brick-domain": "all"})
    params = recipe.trainables(model, plan)
    assert sorted(n for n in params if n.startswith("bricks.")) == \
        sorted(f"bricks.all.{l}.{t}" for l in range(4) for t in ("A1", "A2", "B1", "B2"))
    assert "blocks.1.mlp.fc2.lora_A.weight" not in params
    recipe.begin(params, None)
    logits, _ = forward_with_bricks(model, plan, model.bricks["all"], images)
    ce = torch.nn.functional.cross_entropy(logits, labels).item()
    assert recipe.loss(model, plan, images, labels).item() == pytest.approx(ce)
    saved = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        params["blocks.2.mlp.fc2.lora_A.weight"].add_(0.1)  # 8 x 128 entries: ||.||^2 = 10.24
        params["bricks.all.1.A1"].add_(0.2)  # missing position, 8 x 32 entries: 10.24
        params["bricks.all.3.B2"].add_(0.3)  # a missing position too: 32 x 8 entries: 23.04
        params["bricks.all.2.A2"].add_(5.0)  # retained position: unused, no stage-I term
    logits, _ = forward_with_bricks(model, plan, model.bricks["all"], images)
    ce = torch.nn.functional.cross_entropy(logits, labels).item()
    tethers = 0.01 * 10.24 + 0.005 * (10.24 + 23.04)
    # each tether is a float32 sum of <= 1024 squared shifts, each shift off its c by at most
    # 2u (|p| + c) (the add, the subtraction): relative error below 2 gamma_(n+2) + 4u (|p| + c)
    # / c per tether; the cross-entropy is the same code on both sides
    p_max = max(saved[n].abs().max().item() for n in params)
    rel = float32_atol(1.0, 1.0, 1.0, terms=1024) / 1024 + \
        4 * FLOAT32_ROUNDING * (p_max + 0.3) / 0.1
    assert recipe.loss(model, plan, images, labels).item() == \
        pytest.approx(ce + tethers, rel=4 * FLOAT32_ROUNDING, abs=tethers * rel)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n])


def test_stage_two_loss_terms(setup):
    cfg, recipe, model, images, labels = setup
    plan, alpha = (1, 3), 0.5
    recipe.configure({"layers": list(plan), "brick-domain": "all"})
    logits, pairs = forward_with_bricks(model, plan, model.bricks["all"], images, alpha)
    mse = [((e - f) ** 2).mean().item() for e, f in pairs]
    ce = torch.nn.functional.cross_entropy(logits, labels).item()
    expected = ce + 0.01 / 2 * (mse[0] + mse[1])
    assert min(mse) > 0
    # the same pairs and logits, but mse_loss sums its n squared differences (3 roundings each,
    # none negative, so relative to the MSE itself) in its own order; then a few float32 adds
    n = pairs[0][0].numel()
    mse_atol = 0.01 / 2 * (mse[0] + mse[1]) * float32_atol(1.0, 1.0, 1.0, terms=n) / n
    assert recipe.stage2_loss(model, plan, images, labels, alpha).item() == \
        pytest.approx(expected, rel=4 * FLOAT32_ROUNDING, abs=mse_atol)


def alpha_recorder(seen: list) -> type:
    """A FedBRICK recipe that records the alpha of every stage-II loss it computes."""

    class Recorder(FedBRICKRecipe):
        def stage2_loss(self, model, plan, inputs, labels, alpha):
            seen.append(alpha)
            return super().stage2_loss(model, plan, inputs, labels, alpha)

    return Recorder


def test_fit_trains_stage_one_then_stage_two_with_annealed_alpha(setup):
    cfg, _, model, images, labels = setup
    seen = []
    Recorder = alpha_recorder(seen)

    from fedtune_app.data.splits import Examples

    recipe = Recorder(cfg.replace(**{"batch-size": 2, "fedbrick-stage2-epochs": 2, "lr": 0.05}))
    plan = (0, 2)
    recipe.configure({"layers": list(plan), "brick-domain": "all"})
    params = recipe.trainables(model, plan)
    before = {n: p.detach().clone() for n, p in params.items()}
    frozen = model.blocks[1].mlp.fc2.lora_A.default.weight.detach().clone()
    recipe.begin(params, None)
    recipe.fit(model, plan, params, Examples(images, labels), seed=5, device=torch.device("cpu"),
               loss_fn=lambda x, y: recipe.loss(model, plan, x, y), server_round=1)
    # 5 examples, batches of 2: 3 steps per epoch, 2 epochs -> E2 = 6
    assert seen == pytest.approx([1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    changed = {n for n, p in params.items() if not torch.equal(p, before[n])}
    assert {"bricks.all.0.B1", "bricks.all.2.B1", "blocks.0.mlp.fc2.lora_B.weight",
            "head.weight"} <= changed  # stage I: a missing BRICK; stage II: a retained one
    assert torch.equal(model.blocks[1].mlp.fc2.lora_A.default.weight, frozen)  # not planned
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(before[n])


def test_stage_two_steps_cap_each_epoch(setup):
    cfg, _, model, images, labels = setup
    seen = []
    Recorder = alpha_recorder(seen)

    from fedtune_app.data.splits import Examples

    recipe = Recorder(cfg.replace(**{"batch-size": 2, "fedbrick-stage2-epochs": 2,
                             "fedbrick-stage2-steps": 2, "lr": 0.0}))
    plan = (0, 2)
    recipe.configure({"layers": list(plan), "brick-domain": "all"})
    params = recipe.trainables(model, plan)
    recipe.begin(params, None)
    recipe.fit(model, plan, params, Examples(images, labels), seed=5, device=torch.device("cpu"),
               loss_fn=lambda x, y: recipe.loss(model, plan, x, y), server_round=1)
    # 3 batches per epoch capped at 2, 2 epochs -> E2 = 4 steps, alpha = 1 - e/4
    assert seen == pytest.approx([1, 3 / 4, 2 / 4, 1 / 4])


def test_server_distillation_with_sgd_is_one_plain_gradient_step(setup):
    cfg, _, model, images, labels = setup
    from fedtune_app.data.splits import Examples

    model, images = in_float64(model, images)
    bricks = model.bricks["all"]
    loss = layer_mse(bricks, block_io(model, images))
    grads = torch.autograd.grad(loss, list(bricks.parameters()))
    expected = [p.detach() - 0.5 * g for p, g in zip(bricks.parameters(), grads)]
    # one epoch of one batch (all 5 examples; the mean loss does not depend on their order)
    distill_bricks(model, bricks, Examples(images, labels), epochs=1, lr=0.5, batch_size=5,
                   seed=0, device=torch.device("cpu"), optimizer="sgd")
    for p, e in zip(bricks.parameters(), expected):
        torch.testing.assert_close(p.detach(), e, rtol=0, atol=NETWORK_FLOAT64_ATOL)
    assert resolve_config({"method": "fedbrick"}).own.fedbrick_server_optimizer == "adam"


# -- server: layer-wise distillation, aggregation -----------------------------------------------

def test_a_distillation_step_lowers_the_layer_wise_mse(setup):
    cfg, _, model, images, labels = setup
    from fedtune_app.data.splits import Examples

    # float64 copy: the first step sees the examples shuffled, so its sums run in another order
    model, images = in_float64(model, images)
    bricks = model.bricks["all"]
    blocks = {n: p.detach().clone() for n, p in model.blocks.named_parameters()}
    with torch.no_grad():
        before = layer_mse(bricks, block_io(model, images)).item()
    first, last = distill_bricks(model, bricks, Examples(images, labels), epochs=1, lr=1e-2,
                                 batch_size=5, seed=0, device=torch.device("cpu"))
    with torch.no_grad():
        after = layer_mse(bricks, block_io(model, images)).item()
    # mean over the 4 positions
    assert first == pytest.approx(before / 4, rel=0, abs=NETWORK_FLOAT64_ATOL)
    assert after < before
    assert all(torch.equal(p, blocks[n]) for n, p in model.blocks.named_parameters())


def test_bricks_average_within_their_domain(setup):
    cfg = resolve_config({**TWO_DOMAINS, "method": "fedbrick", "capacities": "2,1,1",
                          "domains": "original,inverted,rotated", "fedbrick-server-epochs": 0})
    info = [ClientInfo(1, 0, 2, 10, "original"), ClientInfo(2, 1, 1, 30, "inverted"),
            ClientInfo(3, 2, 1, 10, "rotated")]
    names = ["blocks.0.w", "blocks.1.w", "head.w"] + \
        [f"bricks.{c}.{l}.B1" for c in ("original", "inverted", "rotated") for l in (0, 1)]
    strategy = FedBRICK(cfg, info, 2, {n: np.zeros(2, np.float32) for n in names})
    assert strategy.client_payload(info[1], (1,)) == \
        ["blocks.1.w", "head.w", "bricks.inverted.0.B1", "bricks.inverted.1.B1"]
    assert strategy.train_config(info[1], (1,)) == {"brick-domain": "inverted"}
    v = lambda a: np.array([a, a], np.float32)  # noqa: E731
    updates = [ClientUpdate("0", {"blocks.0.w": v(1), "blocks.1.w": v(1), "head.w": v(1),
                                  "bricks.original.0.B1": v(4), "bricks.original.1.B1": v(4)}, 10),
               ClientUpdate("1", {"blocks.1.w": v(5), "head.w": v(5),
                                  "bricks.inverted.0.B1": v(8), "bricks.inverted.1.B1": v(8)}, 30)]
    strategy.history.append(RoundLog(1, plans={0: (0, 1), 1: (1,)}))
    new = strategy.aggregate(updates)
    assert new["blocks.0.w"].tolist() == [1, 1]  # only client 0 held it
    assert new["blocks.1.w"].tolist() == [4, 4] and new["head.w"].tolist() == [4, 4]
    assert new["bricks.original.0.B1"].tolist() == [4, 4]  # its domain's client only
    assert new["bricks.inverted.1.B1"].tolist() == [8, 8]
    assert new["bricks.rotated.0.B1"].tolist() == [0, 0]  # nobody of that domain this round
    assert strategy.history[-1].method_metrics["brick-bytes-up"] == 4 * 2 * 4


# -- the proxy split ----------------------------------------------------------------------------

def test_proxy_split_is_per_domain_deterministic_and_excluded_from_client_data():
    rc = {"preset": "offline-feature-skew", "model-source": "random", "train-subset": 600}
    brick = resolve_config(rc | {"method": "fedbrick"})
    splits = run_splits(brick)
    proxy = proxy_indices(brick.data.proxy_fraction, splits)
    domains = splits.train.domains.numpy()
    per_domain = np.bincount(domains[proxy], minlength=6)
    assert per_domain.tolist() == [5] * 6  # 5% of the 100 examples of every domain
    again = resolve_config(rc | {"method": "fedbrick", "seed": 7})
    assert np.array_equal(proxy_indices(again.data.proxy_fraction, run_splits(again)), proxy)
    fedra = resolve_config(rc | {"method": "fedra"})
    fair = resolve_config(rc | {"method": "fedra", "proxy-for-all-methods": True})
    for pid in range(6):
        whole = client_examples(fedra, splits, pid, 6)  # other methods: unchanged
        assert len(whole) == 100 and (whole.domains == pid).all()
        mine = client_examples(brick, splits, pid, 6)
        assert len(mine) == 95 and len(client_examples(fair, splits, pid, 6)) == 95
        flat = mine.inputs.flatten(1)
        held = splits.train.inputs[proxy[domains[proxy] == pid]].flatten(1)
        assert not (flat[:, None] == held[None]).all(-1).any()  # no proxy image among them
    # proxy-held-out = false: the server's proxy examples stay in the clients' data too
    shared = resolve_config(rc | {"method": "fedbrick", "proxy-held-out": False})
    assert np.array_equal(proxy_indices(shared.data.proxy_fraction, splits), proxy)
    for pid in range(6):
        assert len(client_examples(shared, splits, pid, 6)) == 100


# -- end to end ---------------------------------------------------------------------------------

def test_two_rounds_over_two_domains(tmp_path):
    rc = {**TWO_DOMAINS, "method": "fedbrick", "num-server-rounds": 2, "train-subset": 200,
          "test-subset": 40, "batch-size": 16, "fedbrick-server-epochs": 2,
          "results-dir": str(tmp_path)}
    folder = Path(run_inprocess(rc))
    metrics = json.loads((folder / "metrics.json").read_text())
    clients = json.loads((folder / "config.json").read_text())["clients"]
    assert [c["group"] for c in clients] == ["original", "inverted"]
    assert [c["num_examples"] for c in clients] == [95, 95]  # 100 per domain, 5 with the server
    per_brick = 4 * 8 * 32
    for record in metrics:
        assert set(record["accuracy-per-group"]) == {"original", "inverted"}
        assert record["brick-params"] == {"0": 6 * per_brick, "1": 6 * per_brick}
        assert record["brick-bytes-down"] == record["brick-bytes-up"] == 2 * 6 * per_brick * 4
        assert record["server-distill-seconds"] > 0
        assert set(record["server-distill-mse"]) == {"original", "inverted"}
        assert all(0 < mse < 1 for pair in record["server-distill-mse"].values() for mse in pair)
    share = metrics[0]["brick-share"]
    assert 0 < share["0"] < share["1"]  # fewer layers held: BRICKs are a larger share
    state = load_file(str(folder / "state.safetensors"))
    bricks = [n for n in state if n.startswith("bricks.")]
    assert len(bricks) == 2 * 6 * 4
    assert all(np.abs(state[f"bricks.{c}.{l}.B1"]).max() > 0
               for c in ("original", "inverted") for l in range(6))  # trained from B = 0
    allocation = json.loads((folder / "allocation.json").read_text())
    assert [sum(row) for row in allocation[0]["matrix"]] == [4, 2]
    again = load_file(str(Path(run_inprocess(rc)) / "state.safetensors"))
    assert all(np.array_equal(again[n], v) for n, v in state.items())  # same seed, same run
