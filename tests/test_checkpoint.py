"""The checkpoint file on its own, without training: what it restores, and every refusal of a
resume that would not continue the same run (the whole stop-and-resume runs are in
test_resume.py)."""

import json

import numpy as np
import pytest
import torch

from fedtune_app.config import ConfigError
from fedtune_app.federated.checkpoint import FILE, META, resume, save_checkpoint
from fedtune_app.federated.strategy import ClientInfo, LayerPlanStrategy, RoundLog
from fedtune_app.methods import resolve_config

CLIENTS = [ClientInfo(node_id=11, partition_id=0, capacity=2, num_examples=30, group="a",
                      label_counts=(10, 20), checkpoint_bytes=500),
           ClientInfo(node_id=12, partition_id=1, capacity=1, num_examples=20, group="b",
                      label_counts=(20, 0))]
KEYS = {"num-server-rounds": 4, "seed": 3}


def strategy(cfg, clients=CLIENTS, state=None):
    state = state or {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                      "b": np.array([0.5], np.float32)}
    return LayerPlanStrategy(cfg, clients, 2, state)


@pytest.fixture(autouse=True)
def own_folder(tmp_path, monkeypatch):
    """A relative path written by mistake lands in this test's folder, read by no other test."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def saved(tmp_path):
    """A run stopped after round 3: state, FedDyn's h, both RNGs, history and metrics (numpy
    scalars among them, as the evaluation returns)."""
    cfg = resolve_config(KEYS)
    s = strategy(cfg)
    s.state = {"w": np.full((2, 3), 7, np.float32), "b": np.array([-1.5], np.float32)}
    s.h = {"w": np.ones((2, 3), np.float32)}
    s.rng.random(5)  # the sampling RNG has moved on
    torch.manual_seed(42)
    s.history = [RoundLog(1, plans={0: (0, 1), 1: (1,)}),
                 RoundLog(2, plans={0: (0,), 1: (0, 1)}, rejected={1: "screening: x"},
                          state_updated=False),
                 RoundLog(3, plans={0: (1,), 1: (0,)}, nodes={0: 11, 1: 12},
                          errors={1: {"node": 12, "code": 5}})]
    metrics = [{"round": 1, "accuracy": None}, {"round": 2, "accuracy": np.float32(0.25)},
               {"round": 3, "accuracy": None}]
    path = save_checkpoint(tmp_path, s, metrics, cfg)
    return path, s, [m | {"accuracy": m["accuracy"] and float(m["accuracy"])} for m in metrics], cfg


def test_resume_restores_everything_a_round_depends_on(saved):
    path, before, metrics, cfg = saved
    assert path.name == FILE and not list(path.parent.glob("*.tmp"))
    expected_rng = before.rng.random(3)
    expected_torch = torch.rand(3)
    # new process: fresh strategy and RNGs; 'eval-every' and 'num-server-rounds' may change
    torch.manual_seed(0)
    after = strategy(resolve_config(KEYS | {"num-server-rounds": 6, "eval-every": 3,
                                            "resume": str(path.parent)}))
    done = resume(after, after.cfg)
    assert done == metrics and after.round_offset == 3
    assert after.state.keys() == {"w", "b"}
    np.testing.assert_array_equal(after.state["w"], np.full((2, 3), 7, np.float32))
    np.testing.assert_array_equal(after.state["b"], np.array([-1.5], np.float32))
    np.testing.assert_array_equal(after.h["w"], np.ones((2, 3), np.float32))
    assert after.rng.random(3).tolist() == expected_rng.tolist()
    assert torch.rand(3).tolist() == expected_torch.tolist()
    assert [(e.round, e.plans, e.rejected, e.state_updated) for e in after.history] == [
        (1, {0: (0, 1), 1: (1,)}, {}, True), (2, {0: (0,), 1: (0, 1)}, {1: "screening: x"}, False),
        (3, {0: (1,), 1: (0,)}, {}, True)]
    # partition ids are ints again (JSON object keys are strings)
    assert after.history[2].nodes == {0: 11, 1: 12}
    assert after.history[2].errors == {1: {"node": 12, "code": 5}}
    # the file itself names the checkpoint file too, not only its folder
    again = strategy(resolve_config(KEYS | {"resume": str(path)}))
    assert resume(again, again.cfg) == metrics


def test_the_checkpoint_records_the_clients_without_their_connection(saved):
    from safetensors import safe_open

    path, *_ = saved
    with safe_open(str(path), "np") as f:
        meta = json.loads(f.metadata()[META])
    # node ids are new at every connection, the one-time weight fetch only in the first
    assert meta["clients"][0] == {"partition_id": 0, "capacity": 2, "num_examples": 30,
                                  "group": "a", "label_counts": [10, 20], "model_group": 0,
                                  "rank": 0}  # 0: the node reported no rank ('lora-r')
    assert meta["round"] == 3 and meta["config"]["seed"] == 3
    # reconnected clients with new node ids and no fetch resume the same run
    moved = [ClientInfo(node_id=99 + c.partition_id, partition_id=c.partition_id,
                        capacity=c.capacity, num_examples=c.num_examples, group=c.group,
                        label_counts=c.label_counts) for c in CLIENTS]
    s = strategy(resolve_config(KEYS | {"resume": str(path)}), clients=moved)
    assert resume(s, s.cfg)[-1]["round"] == 3


def test_resume_refuses_what_would_not_continue_the_same_run(saved, tmp_path):
    path, *_ = saved
    folder = str(path.parent)
    other = strategy(resolve_config(KEYS | {"resume": folder, "seed": 4, "lr": 0.123}))
    with pytest.raises(ConfigError) as err:
        resume(other, other.cfg)
    lr = resolve_config({}).training.lr
    assert str(err.value) == (  # in the order of the run config's keys
        "run-config key 'resume': the stopped run had other settings; resuming needs the same "
        f"values for 'seed' = 4 (checkpoint: 3), 'lr' = 0.123 (checkpoint: {lr})")
    fewer = strategy(resolve_config(KEYS | {"resume": folder}), clients=CLIENTS[:1])
    with pytest.raises(ConfigError) as err:
        resume(fewer, fewer.cfg)
    assert str(err.value).startswith("run-config key 'resume': the connected clients differ "
                                     "from the stopped run's: [{'partition_id': 0")
    done = strategy(resolve_config(KEYS | {"resume": folder, "num-server-rounds": 3}))
    with pytest.raises(ConfigError, match="already has 3 rounds; key 'num-server-rounds' = 3"):
        resume(done, done.cfg)
    # one more round than the checkpoint: allowed
    four = strategy(resolve_config(KEYS | {"resume": folder, "num-server-rounds": 4}))
    assert resume(four, four.cfg)[-1]["round"] == 3
    shapes = strategy(resolve_config(KEYS | {"resume": folder}),
                      state={"w": np.zeros((3, 2), np.float32), "b": np.zeros(1, np.float32)})
    with pytest.raises(ConfigError, match="do not match this model and adapter"):
        resume(shapes, shapes.cfg)
    names = strategy(resolve_config(KEYS | {"resume": folder}),
                     state={"w": np.zeros((2, 3), np.float32), "c": np.zeros(1, np.float32)})
    with pytest.raises(ConfigError, match="do not match this model and adapter"):
        resume(names, names.cfg)


def test_resume_names_a_missing_or_unreadable_file(saved, tmp_path):
    path, *_ = saved
    nowhere = str(tmp_path / "nowhere")
    s = strategy(resolve_config(KEYS | {"resume": nowhere}))
    with pytest.raises(ConfigError) as err:
        resume(s, s.cfg)
    assert str(err.value) == (
        f"run-config key 'resume' = '{nowhere}': no checkpoint file {nowhere}; give a "
        f"results folder holding {FILE} (written every 'checkpoint-every' rounds)")
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / FILE).write_bytes(path.read_bytes()[:100])
    s = strategy(resolve_config(KEYS | {"resume": str(truncated)}))
    with pytest.raises(ConfigError, match="not a readable fedtune checkpoint .*; it may be "
                       "truncated or from another program$"):
        resume(s, s.cfg)
    # a safetensors file of another program: no fedtune metadata
    from safetensors.numpy import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"x": np.zeros(1, np.float32)}, str(foreign))
    s = strategy(resolve_config(KEYS | {"resume": str(foreign)}))
    with pytest.raises(ConfigError, match=r"not a readable fedtune checkpoint \(KeyError"):
        resume(s, s.cfg)
