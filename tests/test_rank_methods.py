"""Clients that differ in LoRA rank: the aggregation rules of FedIT, FedEx-LoRA, FLoRA, FlexLoRA
and HetLoRA on hand-worked 2 x 2 examples, rank as a client's capacity, bad input, every rank
method on the smoke preset, and a resumed run bit for bit."""

import json

import numpy as np
import pytest

from fedtune_app.config import ConfigError
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.strategy import ClientInfo, RoundLog
from fedtune_app.methods import METHODS, resolve_config
from fedtune_app.methods.flexlora import top_factors
from fedtune_app.methods.flora import stack
from fedtune_app.methods.hetlora import kept_rank
from runs import assert_same_tensors, final_state, run
from test_resume import KEYS as RESUME_KEYS
from test_resume import GridKilledInRound3, ServerKilled

M = "blocks.0.f"  # one adapted Linear, d_in = d_out = 2
A, B, D = M + ".lora_A.weight", M + ".lora_B.weight", M + ".lora_delta"
RANK_METHODS = ["fedit", "ffa-lora", "fedsa-lora", "fedex-lora", "flora", "flexlora", "hetlora"]


def f32(x):
    return np.asarray(x, dtype=np.float32)


def strategy(method, top=2, ranks=(2, 2), examples=(1, 3), alpha=4.0, **keys):
    """The method's strategy over one module of rank ``top``, s = alpha / top (2 by default)."""
    cfg = resolve_config({"method": method, "lora-r": top, "lora-alpha": alpha,
                          "capacities": ",".join("1" * len(ranks))} | keys)
    clients = [ClientInfo(10 + i, i, 1, n, "g", rank=r)
               for i, (r, n) in enumerate(zip(ranks, examples))]
    state = {A: np.zeros((top, 2), np.float32), B: np.zeros((2, top), np.float32),
             D: np.zeros((2, 2), np.float32), "head.bias": f32([0.0, 0.0])}
    s = METHODS[method].strategy(cfg, clients, 1, state)
    s.history.append(RoundLog(1, plans={c.partition_id: (0,) for c in clients}))
    s.round_ranks = {c.partition_id: s.rank(c) for c in clients}
    return s


def reply(s, pid, n, a, b, bias=(0.0, 0.0)):
    """Client ``pid``'s reply as the strategy takes it (padded to rank R at the boundary)."""
    client = s.clients[pid]
    return ClientUpdate(str(pid), s.received_tensors(client, {A: f32(a), B: f32(b),
                                                              "head.bias": f32(bias)}), n)


# client 0: rank 1, 1 example, B0 A0 = [[1, 2], [0, 0]]; client 1: rank 2, 3 examples,
# B1 A1 = [[0, 0], [2, 0]]; p = (1/4, 3/4): sum_i p_i B_i A_i = [[0.25, 0.5], [1.5, 0]]
EXACT = np.array([[0.25, 0.5], [1.5, 0.0]])


def two_clients(method, **keys):
    s = strategy(method, ranks=(1, 2), **keys)
    return s, [reply(s, 0, 1, [[1, 2]], [[1], [0]], (4.0, 0.0)),
               reply(s, 1, 3, [[0, 1], [1, 0]], [[0, 0], [0, 2]], (0.0, 8.0))]


def test_flora_stacks_to_the_exact_weighted_sum_and_merges_it():
    s, updates = two_clients("flora")
    b_stack, a_stack = stack(updates, M)
    # B_stack = [B0 | B1], A_stack = [A0 / 4 ; 3 A1 / 4]: their product is sum_i p_i B_i A_i
    np.testing.assert_array_equal(b_stack @ a_stack, EXACT)
    new = s.aggregate(updates)
    np.testing.assert_allclose(new[D], 2 * EXACT, rtol=0, atol=1e-6)  # merged with s = 2
    np.testing.assert_array_equal(new[B], 0)  # fresh adapters for the next round
    assert np.abs(new[A]).max() <= 1 / np.sqrt(2) and np.abs(new[A]).min() > 0
    np.testing.assert_allclose(new["head.bias"], [1.0, 6.0])  # (4, 0)/4 + (0, 8) 3/4


def test_fedit_misses_the_mean_by_the_residual_that_fedex_folds_back():
    s, updates = two_clients("fedit")
    new = s.aggregate(updates)
    # component 0 of both clients (weights 1/4, 3/4), component 1 of client 1 alone
    np.testing.assert_allclose(new[A], [[0.25, 1.25], [1.0, 0.0]], atol=1e-7)
    np.testing.assert_allclose(new[B], [[0.25, 0.0], [0.0, 2.0]], atol=1e-7)
    fedit = new[B].astype(np.float64) @ new[A]  # [[1/16, 5/16], [2, 0]]
    np.testing.assert_allclose(EXACT - fedit, [[0.1875, 0.1875], [-0.5, 0.0]], atol=1e-7)
    fx, updates = two_clients("fedex-lora")
    folded = fx.aggregate(updates)
    np.testing.assert_allclose(folded[D], 2 * (EXACT - fedit), atol=1e-6)
    np.testing.assert_allclose(folded[D] + 2 * folded[B].astype(np.float64) @ folded[A],
                               2 * EXACT, atol=1e-6)  # W0 + delta + s B A: exact


def test_fedit_residual_of_equal_ranks_is_the_known_cross_term():
    """Two clients of one rank: sum p_i B_i A_i - B A = p_0 p_1 (B_0 - B_1)(A_0 - A_1)."""
    s = strategy("fedit", examples=(1, 3))
    a0, b0, a1, b1 = [[1, 0], [0, 1]], [[2, 0], [0, 0]], [[0, 1], [1, 1]], [[0, 1], [1, 0]]
    new = s.aggregate([reply(s, 0, 1, a0, b0), reply(s, 1, 3, a1, b1)])
    exact = 0.25 * np.array(b0) @ np.array(a0) + 0.75 * np.array(b1) @ np.array(a1)
    cross = 0.25 * 0.75 * (np.array(b0) - b1) @ (np.array(a0) - a1)
    np.testing.assert_allclose(exact - new[B].astype(np.float64) @ new[A], cross, atol=1e-6)


def test_flexlora_hands_out_the_top_singular_pairs_of_the_mean_update():
    s = strategy("flexlora", examples=(1, 1))
    # B0 A0 = diag(4, 0), B1 A1 = diag(2, 2): W = diag(3, 1), singular values 3 and 1
    new = s.aggregate([reply(s, 0, 1, np.eye(2), [[4, 0], [0, 0]]),
                       reply(s, 1, 1, np.eye(2), [[2, 0], [0, 2]])])
    np.testing.assert_allclose(new[B].astype(np.float64) @ new[A], np.diag([3.0, 1.0]), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(new[B], axis=0), [3.0, 1.0], atol=1e-6)
    s.state = new
    one = s.client_tensors(ClientInfo(12, 0, 1, 1, "g", rank=1), (0,))
    np.testing.assert_allclose(one[B].astype(np.float64) @ one[A], np.diag([3.0, 0.0]),
                               atol=1e-6)  # its best rank-1 approximation
    np.testing.assert_array_equal(new[D], 0)  # rank 2 = R holds all of W


def test_flexlora_keeps_what_lies_beyond_rank_r_for_the_global_model():
    s = strategy("flexlora", top=1, ranks=(1, 1), examples=(1, 1), alpha=2.0)
    new = s.aggregate([reply(s, 0, 1, [[1, 0]], [[6], [0]]),  # diag(6, 0)
                       reply(s, 1, 1, [[0, 1]], [[0], [2]])])  # diag(0, 2): W = diag(3, 1)
    np.testing.assert_allclose(new[B].astype(np.float64) @ new[A], np.diag([3.0, 0.0]), atol=1e-6)
    np.testing.assert_allclose(new[D], np.diag([0.0, 2.0]), atol=1e-6)  # s (W - B A), s = 2
    b, a = top_factors(np.diag([3.0, 1.0]), 2, "sqrt")
    np.testing.assert_allclose(np.abs(b), np.diag([np.sqrt(3), 1.0]), atol=1e-12)


def test_hetlora_pads_weights_by_sparsity_and_truncates_on_three_clients():
    s = strategy("hetlora", top=3, ranks=(3, 2, 1), examples=(5, 7, 9))
    updates = [reply(s, 0, 5, [[1, 0], [0, 1], [1, 1]], [[1, 0, 0], [0, 0, 0]]),  # ||.|| = 1
               reply(s, 1, 7, [[2, 0], [0, 2]], [[0, 0], [0, 1]]),  # B A = diag(0, 2): 2
               reply(s, 2, 9, [[1, 1]], [[1], [1]])]  # B A = ones: ||.||_F = 2
    new = s.aggregate(updates)  # weights 1/5, 2/5, 2/5 over the zero-padded factors
    np.testing.assert_allclose(new[A], [[1.4, 0.4], [0.0, 1.0], [0.2, 0.2]], atol=1e-6)
    np.testing.assert_allclose(new[B], [[0.6, 0.0, 0.0], [0.4, 0.4, 0.0]], atol=1e-6)
    s.state = new
    two = s.client_tensors(s.clients[1], (0,))  # truncation to rank 2
    np.testing.assert_allclose(two[A], [[1.4, 0.4], [0.0, 1.0]], atol=1e-6)
    np.testing.assert_allclose(two[B], [[0.6, 0.0], [0.4, 0.4]], atol=1e-6)


def test_hetlora_self_pruning_shrinks_a_clients_rank_from_then_on():
    assert [kept_rank(r, 0.99) for r in (8, 2, 1)] == [7, 1, 1]
    assert kept_rank(8, 0.5) == 4
    s = strategy("hetlora", top=3, ranks=(3, 2), examples=(1, 1))
    s.received_tensors(s.clients[0], {A: f32(np.ones((2, 2))), B: f32(np.ones((2, 2)))})
    assert s.pruned == {0: 2} and s.rank(s.clients[0]) == 2  # pruned 3 -> 2
    with pytest.raises(ValueError, match=r"expected \(2, 2\): rank 2"):
        s.received_tensors(s.clients[1], {A: f32(np.ones((3, 2))), B: f32(np.ones((2, 3)))})
    s.pruned = {1: 1}
    assert s.extra_state()["hetlora-rank/1"] == 1


def test_a_reply_of_another_rank_is_rejected_by_name():
    s = strategy("fedit", ranks=(1, 2))
    with pytest.raises(ValueError, match=r"'blocks.0.f.lora_A.weight' has shape \(2, 2\), "
                                         r"expected \(1, 2\): rank 1"):
        s.received_tensors(s.clients[0], {A: f32(np.ones((2, 2))), B: f32(np.ones((2, 1)))})


@pytest.mark.parametrize("keys, message", [
    ({"method": "fedit", "ranks": "4,0,1", "lora-r": 4}, "rank 0 is outside 1..4"),
    ({"method": "flora", "ranks": "9"}, "rank 9 is outside 1..8; ranks run from 1 to "
                                        "run-config key 'lora-r' = 8"),
    ({"method": "fedit", "ranks": "2,2"}, "lists 2 ranks but the capacity profile describes 3"),
    ({"method": "fedra", "ranks": "2"}, "'ranks' = '2' with method 'fedra'"),
    ({"method": "flora", "aggregator": "median"}, "defined for the weighted mean only"),
    ({"method": "hetlora", "adapter": "bottleneck"}, "use adapter = lora"),
])
def test_bad_rank_settings_are_refused_clearly(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_config({"preset": "smoke"} | keys)


@pytest.mark.parametrize("method", RANK_METHODS)
def test_every_rank_method_runs_the_smoke_preset_with_mixed_ranks(method, tmp_path):
    folder = run(tmp_path, method=method, ranks="4,2,1", **{"lora-r": 4})
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    assert all(not m.get("rejected") for m in metrics)
    state = final_state(folder)
    deltas = [n for n in state if n.endswith(".lora_delta")]
    assert bool(deltas) == (method in ("flora", "fedex-lora", "flexlora"))
    if method == "flora":  # merged: fresh B = 0, the learnt update in the deltas
        assert all(not state[n].any() for n in state if ".lora_B." in n)
        assert any(state[n].any() for n in deltas)


def test_bytes_follow_the_ranks_each_client_holds(tmp_path):
    """Partition i of rank r_i and capacity L_i gets L_i r_i (d_in + d_out) floats of factors
    per adapted Linear of a block, plus the head, and sends as much back."""
    folder = run(tmp_path, method="fedit", ranks="4,2,1", **{"lora-r": 4,
                                                             "num-server-rounds": 1})
    [metrics] = json.loads((folder / "metrics.json").read_text())
    state = final_state(folder)
    per_rank = sum(v.shape[1] if ".lora_A." in n else v.shape[0]
                   for n, v in state.items() if n.startswith("blocks.0.") and ".lora_" in n)
    head = sum(v.size for n, v in state.items() if n.startswith("head."))
    floats = sum(c * r * per_rank + head for c, r in zip((4, 2, 1), (4, 2, 1)))
    # per block at rank 1: mlp_tokens.fc2 (16 + 16) + mlp_channels.fc2 (128 + 32) = 192 floats;
    # head 10 x 32 + 10 = 330
    assert (per_rank, head) == (192, 330)
    assert metrics["trainable-params"] == {"0": 4 * 4 * 192 + 330, "1": 2 * 2 * 192 + 330,
                                           "2": 1 * 1 * 192 + 330}
    assert metrics["bytes-down"] == metrics["bytes-up"]
    framing = metrics["bytes-down"] - 4 * floats  # the record's own bytes, per tensor sent
    assert 0 <= framing < 200 * (4 * 4 + 2 * 4 + 1 * 4 + 3 * 2), framing


@pytest.mark.parametrize("method", ["flora", "hetlora"])
def test_resumed_rank_run_ends_bit_for_bit_like_the_uninterrupted_one(method, tmp_path):
    keys = RESUME_KEYS | {"method": method, "ranks": "4,2,1", "lora-r": 4}
    whole = run(tmp_path / "whole", **keys)
    with pytest.raises(ServerKilled):
        run(tmp_path / "stopped", grid_class=GridKilledInRound3, **keys)
    [stopped] = (tmp_path / "stopped").iterdir()
    resumed = run(tmp_path / "resumed", resume=str(stopped), **keys)
    assert_same_tensors(final_state(resumed), final_state(whole))


@pytest.mark.parametrize("method", ["flexlora", "hetlora"])
def test_export_at_a_chosen_rank_folds_the_whole_update_into_peft_factors(method, tmp_path):
    """dW = lora_delta + s B A per adapted Linear (s = 8 / 4 = 2); --rank K writes a peft LoRA
    of rank K at scale s whose s B' A' is dW's best rank-K approximation: exact at K = 32 (the
    smaller side of every adapted Linear: 16 x 16 and 32 x 128), with the Eckart-Young error
    sqrt(sum of the squared singular values beyond K / all of them) at K = 1."""
    from peft import PeftModel
    from safetensors.numpy import load_file

    from fedtune_app.tools.export import export_run

    folder = run(tmp_path, method=method, ranks="4,2,1", **{"lora-r": 4, "lora-alpha": 8.0})
    state = final_state(folder)
    if method == "flexlora":  # the residual beyond rank 4 is a fedtune-only tensor
        with pytest.raises(ConfigError, match="--rank K to fold each lora_delta"):
            export_run(folder, out=tmp_path / "refused")
    for k in (32, 1):
        out = export_run(folder, out=tmp_path / f"rank{k}", rank=k)
        saved = load_file(str(out / "adapter_model.safetensors"))
        report = json.loads((out / "rank.json").read_text())
        config = json.loads((out / "adapter_config.json").read_text())
        assert (config["r"], config["lora_alpha"]) == (k, 2.0 * k)
        for module in [n.removesuffix(".lora_A.weight") for n in state if ".lora_A." in n]:
            dw = 2.0 * state[module + ".lora_B.weight"].astype(np.float64) \
                @ state[module + ".lora_A.weight"]
            if method == "flexlora":
                dw = dw + state[module + ".lora_delta"]
            a = saved[f"base_model.model.{module}.lora_A.weight"].astype(np.float64)
            b = saved[f"base_model.model.{module}.lora_B.weight"].astype(np.float64)
            assert a.shape[0] == b.shape[1] == k
            sigma = np.linalg.svd(dw, compute_uv=False)
            tail = float(np.sqrt((sigma[k:] ** 2).sum() / (sigma ** 2).sum()))
            # float32 factors of a float64 product: relative rounding of about 1e-7 per entry
            tol = 1e-5 * float(np.abs(dw).max())
            if k == 32:
                np.testing.assert_allclose(2.0 * b @ a, dw, rtol=0, atol=tol)
            assert np.linalg.norm(dw - 2.0 * b @ a) / np.linalg.norm(dw) == pytest.approx(
                tail, abs=1e-5)
            assert report["relative-error"][module] == pytest.approx(tail, abs=1e-9)
        if method == "hetlora":  # its global update has rank <= 4: exact from K = 4 on
            assert report["max-relative-error"] < 1e-6 or k == 1
    # peft loads it at the same scale
    cfg = resolve_config(json.loads((folder / "config.json").read_text())["run-config"])
    from fedtune_app.model.backbones import ModelSpec, build_backbone
    base = build_backbone(ModelSpec.from_config(cfg.model, 10)).library_model()
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "rank1"))
    module = peft_model.base_model.model.blocks[0].mlp_channels.fc2
    assert module.scaling["default"] == 2.0 and module.r["default"] == 1
