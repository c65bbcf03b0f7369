"""Whole federations through the real ServerApp logic and ClientApp, in-process (no Ray)."""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.config import app_defaults
from fedtune_app.federated.wire import TrainReply, TrainTask
from fedtune_app.methods import resolve_config
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, initial_state
from fedtune_app.model.backbones import ModelSpec, build_backbone
from inprocess import InProcessGrid, simulation_nodes
from runs import assert_accuracy_counts_the_test_set

SMOKE_CAPACITIES = [4, 2, 1]


def run(tmp_path, **keys):
    rc = {**app_defaults(), "preset": "smoke", "results-dir": str(tmp_path), **keys}
    cfg = resolve_config(rc)
    grid = InProcessGrid(client_app, simulation_nodes(len(cfg.federation.capacity_list)), rc)
    return Path(run_federation(grid, cfg)), grid, cfg


def smoke_initial_state(cfg):
    model = attach_adapters(build_backbone(ModelSpec.from_config(cfg.model, 10)),
                            AdapterSpec.from_config(cfg.adapter))
    return initial_state(model, cfg.seed)


@pytest.mark.parametrize("method", ["fedra", "all-large", "all-small"])
def test_two_rounds_write_the_results_folder_and_send_only_planned_tensors(tmp_path, method):
    folder, grid, cfg = run(tmp_path, method=method)
    assert sorted(p.name for p in folder.iterdir()) == [
        "accuracy.png", "allocation.json", "checkpoint.safetensors", "config.json", "metrics.json",
        "partition.png", "state.safetensors"]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["accuracy"] == m["accuracy-pooled"]  # digits have no domains
        assert_accuracy_counts_the_test_set(m, cfg)
        assert m["loss"] > 0 and m["seconds"] > 0
        assert set(m["accuracy-per-group"]) == {"client-0", "client-1", "client-2"}
        assert m["rejected"] == {}

    rows = json.loads((folder / "allocation.json").read_text())
    expected_depth = {"fedra": SMOKE_CAPACITIES, "all-large": [4, 4, 4], "all-small": [1, 1, 1]}
    for r in rows:
        m = np.array(r["matrix"])
        assert m.sum(1).tolist() == expected_depth[method]
        if method == "all-small":
            assert m[:, 0].all() and not m[:, 1:].any()

    # every TRAIN message carries exactly its plan's trainables + head, nothing frozen
    train_msgs = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train_msgs) == 6
    for msg in train_msgs:
        task = TrainTask.from_message(msg)
        plan, names = set(task.layers), set(task.arrays)
        assert {"head.weight", "head.bias"} <= names
        blocks = {int(n.split(".")[1]) for n in names if n.startswith("blocks.")}
        assert blocks == plan
        assert all(".lora_A." in n or ".lora_B." in n or n.startswith("head.") for n in names)
        # 4 LoRA tensors per planned block, r=8 on the last FC of both sublayers: the token
        # MLP's fc2 (16 -> 16 patches): 8*16 + 16*8, the channel MLP's fc2 (128 -> 32):
        # 8*128 + 32*8 floats
        n_floats = sum(a.numpy().size for a in task.arrays.values())
        assert n_floats == len(plan) * (8 * 16 + 16 * 8 + 8 * 128 + 32 * 8) + 32 * 10 + 10

    # bytes-down = what the ArrayRecords count, and at least the raw float32 payload
    # (plus each Array's own metadata: its name, dtype and shape, well under 256 bytes)
    arrays = [a for m in train_msgs[:3] for a in TrainTask.from_message(m).arrays.values()]
    raw_bytes = sum(a.numpy().nbytes for a in arrays)
    assert raw_bytes <= metrics[0]["bytes-down"] <= raw_bytes + 256 * len(arrays)

    final = load_file(str(folder / "state.safetensors"))
    start = smoke_initial_state(cfg)
    changed = {n for n in start if not np.array_equal(start[n], final[n])}
    assert "head.weight" in changed
    if method == "all-small":  # blocks 1..3 were never trained: they keep their initial value
        assert all(not n.startswith(("blocks.1.", "blocks.2.", "blocks.3.")) for n in changed)
        assert any(n.startswith("blocks.0.") for n in changed)


def test_same_seed_same_final_state_different_seed_differs(tmp_path):
    a = load_file(str(run(tmp_path / "a", seed=3)[0] / "state.safetensors"))
    b = load_file(str(run(tmp_path / "b", seed=3)[0] / "state.safetensors"))
    c = load_file(str(run(tmp_path / "c", seed=4)[0] / "state.safetensors"))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def test_a_client_that_fails_is_rejected_and_the_round_goes_on(tmp_path):
    def corrupt(msg, reply):
        if msg.metadata.message_type != "train":
            return reply
        arrays = TrainReply.from_message(reply).arrays
        name = next(iter(arrays))
        from flwr.app import Array
        arrays[name] = Array(np.full(arrays[name].shape, np.nan, dtype=np.float32))
        return reply
    rc = {**app_defaults(), "preset": "smoke", "results-dir": str(tmp_path)}
    grid = InProcessGrid(client_app, simulation_nodes(3), rc, faults={1: corrupt})
    folder = Path(run_federation(grid, resolve_config(rc)))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert all("NaN or Inf" in m["rejected"]["1"] for m in metrics)
    final = load_file(str(folder / "state.safetensors"))
    assert all(np.isfinite(v).all() for v in final.values())


def test_text_model_end_to_end_minilm_on_bbc_news(tmp_path):
    """The real pretrained MiniLM on real BBC News, 1 round, 2 clients holding 2 and 1 layers."""
    folder, grid, cfg = run(tmp_path, preset="", **{
        "capacities": "2,1", "num-server-rounds": 1, "train-subset": 60, "test-subset": 25,
        "max-length": 32, "min-partition-size": 5})
    metrics = json.loads((folder / "metrics.json").read_text())
    assert len(metrics) == 1
    assert_accuracy_counts_the_test_set(metrics[0], cfg)
    names = set(TrainTask.from_message(next(m for m in grid.sent
                                            if m.metadata.message_type == "train")).arrays)
    assert any(n.endswith("output.dense.lora_A.weight") for n in names)


def test_the_grid_keeps_no_sent_message_when_told_not_to():
    # each train message holds the arrays sent to one client: kept for every round, a
    # whole-model run grew by a model per client and round (MiniLM: ~530 MB a round)
    from flwr.app import ArrayRecord, MessageType, RecordDict

    def message(grid):
        [nid] = grid.get_node_ids()
        grid.go_offline(nid)  # the SuperLink answers for an offline node: no client runs
        return grid.create_message(RecordDict({"arrays": ArrayRecord()}), MessageType.TRAIN,
                                   nid, "1")

    plain = InProcessGrid(None, simulation_nodes(1), {}, keep_sent=False)
    assert len(plain.pull_messages(plain.push_messages([message(plain)]))) == 1
    assert plain.sent == []
    kept = InProcessGrid(None, simulation_nodes(1), {}, keep_sent=True)
    sent = message(kept)
    kept.push_messages([sent])
    assert kept.sent == [sent]
