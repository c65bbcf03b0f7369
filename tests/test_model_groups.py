"""Model groups: config, assignment, per-group state and aggregation, and two-group
federations of tiny random-init ViTs of different widths and depths, in-process."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedtune_app.apps import client
from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.config import ConfigError
from fedtune_app.data.groups import (
    group_config,
    group_depths,
    group_specs,
    node_model_group,
    prefix,
)
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.strategy import ClientInfo
from fedtune_app.methods import resolve_config, strategy_class
from fedtune_app.model.backbones import BUILDS, ModelSpec, build_backbone

VIT = "img_size=8,patch_size=2,in_chans=1,num_heads=2"
TWO_GROUPS = {"preset": "smoke", "model-groups": "vit_tiny_patch16_224",
              "model-group-args": f"{VIT},embed_dim=16,depth=2;{VIT},embed_dim=32,depth=3",
              "model-group-sources": "random", "capacities": "1,1,1,1",
              "model-group-ratio": "1:1", "num-server-rounds": 1}
# LoRA r=8 on attn.proj (d -> d): A 8 x d + B d x 8, and on mlp.fc2 (in 4d, out d): A 8 x 4d
# + B d x 8, of each block; head d x 10 + 10
PARAMS = {0: 2 * (8 * 16 + 16 * 8 + 8 * 64 + 16 * 8) + 16 * 10 + 10,   # 1962
          1: 3 * (8 * 32 + 32 * 8 + 8 * 128 + 32 * 8) + 32 * 10 + 10}  # 5706


def cfg_of(**keys):
    return resolve_config({**TWO_GROUPS, "method": "homo", **keys})


def test_group_keys_one_entry_serves_every_group():
    cfg = cfg_of()
    specs = group_specs(cfg.model)
    assert [s["model"] for s in specs] == ["vit_tiny_patch16_224"] * 2
    assert [s["model-source"] for s in specs] == ["random"] * 2
    assert specs[1]["model-args"].endswith("embed_dim=32,depth=3")
    assert group_config(cfg, 1).model.model_args == specs[1]["model-args"]
    assert group_config(cfg, None) is cfg
    assert group_depths(cfg) == [2, 3]  # read from the architecture (meta device)


@pytest.mark.parametrize("keys, match", [
    ({"model-group-sources": "random;random;random"}, "has 2 entries but another .* has 3"),
    ({"model-group-ratio": "1:2:3"}, "model-group-ratio"),
    ({"model-group-ratio": "a:b"}, "model-group-ratio"),
    ({"model-group-assign": "capacity", "model-group-capacities": "4,2"}, "ascending"),
    ({"method": "fedra"}, "does not run over model groups"),
    ({"method": "homo", "model-groups": ""}, "needs model groups"),
])
def test_bad_group_keys_are_named(keys, match):
    with pytest.raises(ConfigError, match=match):
        cfg_of(**keys)


def test_ratio_assignment_follows_the_ratio_and_the_seed():
    cfg = cfg_of(**{"model-group-args": ";".join([f"{VIT},embed_dim=16,depth=1"] * 4),
                    "model-group-ratio": "3:3:2:2"})
    groups = [node_model_group(cfg, pid, 10, 1) for pid in range(10)]
    assert Counter(groups) == {0: 3, 1: 3, 2: 2, 3: 2}
    assert groups == [node_model_group(cfg, pid, 10, 1) for pid in range(10)]


def test_capacity_assignment_and_fixed_groups_of_all_small_and_all_large():
    cfg = cfg_of(**{"model-group-assign": "capacity", "model-group-capacities": "2,4"})
    assert [node_model_group(cfg, 0, 4, c) for c in (2, 3, 4, 9)] == [0, 0, 1, 1]
    with pytest.raises(ConfigError, match="below every threshold"):
        node_model_group(cfg, 0, 4, 1)
    assert {node_model_group(cfg_of(method="all-small"), p, 4, 1) for p in range(4)} == {0}
    assert {node_model_group(cfg_of(method="all-large"), p, 4, 1) for p in range(4)} == {1}
    assert node_model_group(resolve_config({"preset": "smoke"}), 0, 3, 4) is None


def test_homo_aggregates_each_group_over_its_own_clients_only():
    cfg = cfg_of()
    clients = [ClientInfo(10 + i, i, 1, 10, f"c{i}", model_group=g)
               for i, g in enumerate([0, 0, 1])]
    state = {"groups.0.head.bias": np.zeros(2, np.float32),
             "groups.1.head.bias": np.full(2, 7.0, np.float32)}
    strategy = strategy_class(cfg)(cfg, clients, 3, state)
    assert [strategy.client_payload(c, ()) for c in clients] == [
        ["groups.0.head.bias"], ["groups.0.head.bias"], ["groups.1.head.bias"]]
    assert strategy.plan_round(1, clients) == [(0, 1), (0, 1), (0, 1, 2)]
    new = strategy.aggregate([
        ClientUpdate("0", {"groups.0.head.bias": np.array([1.0, 2.0], np.float32)}, 1),
        ClientUpdate("1", {"groups.0.head.bias": np.array([5.0, 6.0], np.float32)}, 3),
        ClientUpdate("2", {"groups.1.head.bias": np.array([-1.0, 0.0], np.float32)}, 2)])
    # group 0: (1*[1,2] + 3*[5,6]) / 4 = [4, 5]; group 1: its one client's value
    np.testing.assert_allclose(new["groups.0.head.bias"], [4.0, 5.0])
    np.testing.assert_allclose(new["groups.1.head.bias"], [-1.0, 0.0])


def metrics_and_clients(folder):
    folder = Path(folder)
    return (json.loads((folder / "metrics.json").read_text()),
            json.loads((folder / "config.json").read_text())["clients"])


def test_two_group_homo_run_trains_each_group_model_and_reports_per_group(tmp_path):
    client._MODELS.clear()
    builds = BUILDS["count"]
    folder = run_inprocess({**TWO_GROUPS, "method": "homo", "num-server-rounds": 2,
                            "results-dir": str(tmp_path)})
    metrics, clients = metrics_and_clients(folder)
    cfg = cfg_of()
    groups = {c["partition_id"]: c["model_group"] for c in clients}
    assert groups == {p: node_model_group(cfg, p, 4, 1) for p in range(4)}  # the query reply
    assert sorted(Counter(groups.values()).values()) == [2, 2]
    # 2 server models + 2 client models (one per group, cached across nodes and rounds)
    assert BUILDS["count"] - builds == 4
    for m in metrics:
        per = m["accuracy-per-model-group"]
        assert set(per) == {"0", "1"}
        assert m["accuracy"] == pytest.approx((per["0"] + per["1"]) / 2)
        assert (m["accuracy-smallest"], m["accuracy-largest"]) == (per["0"], per["1"])
        assert m["trainable-params"] == {str(p): PARAMS[g] for p, g in groups.items()}
        assert m["bytes-up"] >= 4 * sum(PARAMS[g] for g in groups.values())  # float32
    from safetensors.numpy import load_file

    state = load_file(str(Path(folder) / "state.safetensors"))
    for g, width in ((0, 16), (1, 32)):
        assert state[f"{prefix(g)}head.weight"].shape == (10, width)
    from fedtune_app.apps.evaluation import build_global

    model, recipe = build_global(cfg)
    initial = recipe.initial_state(model, cfg.seed)
    assert set(initial) == set(state)
    for g in (0, 1):  # both groups trained their own head
        assert not np.allclose(initial[f"{prefix(g)}head.weight"], state[f"{prefix(g)}head.weight"])


@pytest.mark.parametrize("method, group", [("all-small", 0), ("all-large", 1)])
def test_all_small_and_all_large_put_everyone_in_one_group(tmp_path, method, group):
    folder = run_inprocess({**TWO_GROUPS, "method": method, "results-dir": str(tmp_path)})
    metrics, clients = metrics_and_clients(folder)
    assert {c["model_group"] for c in clients} == {group}
    assert set(metrics[0]["accuracy-per-model-group"]) == {str(group)}
    assert set(metrics[0]["trainable-params"].values()) == {PARAMS[group]}


def test_client_runtime_keeps_one_model_per_group():
    client._MODELS.clear()
    cfg = cfg_of()
    from fedtune_app.methods import recipe_for

    models = [client.runtime(group_config(cfg, g), recipe_for(cfg, g))[0] for g in (0, 1, 0, 1)]
    assert models[0] is models[2] and models[1] is models[3] and models[0] is not models[1]
    assert [m.head.in_features for m in models[:2]] == [16, 32]
    ref = build_backbone(ModelSpec.from_config(group_config(cfg, 1).model, 10))
    assert len(ref.blocks) == models[1].num_blocks == 3


def test_compare_reports_the_mean_over_model_groups_and_each_client_of_its_group(tmp_path):
    import csv

    from fedtune_app.tools.compare import compare

    rows = compare(["homo", "all-small"], TWO_GROUPS, tmp_path, command="test")
    with (tmp_path / "compare.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[1:7] == [f"client-{i} (L=1)" for i in range(4)] + [
        "test accuracy", "overall"]
    for row, line in zip(rows, table):
        last = json.loads((Path(row["folder"]) / "metrics.json").read_text())[-1]
        per = last["accuracy-per-model-group"]
        # the headline: the mean over the groups' models (HeteroTune's Avg)
        assert float(line["test accuracy"]) == pytest.approx(
            100 * np.mean(list(per.values())), abs=0.005)
        # a client's column: its group's model, re-weighted to the client's labels
        for key, acc in last["accuracy-per-group"].items():
            column = f"{key.split('/')[1]} (L=1)"
            assert float(line[column]) == pytest.approx(100 * acc, abs=0.005)
        extras = json.loads(line["extras"])
        assert extras["accuracy-smallest"] == per["0"]
        assert extras["accuracy-largest"] == per[max(per)]
