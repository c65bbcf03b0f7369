"""FedProx and FedDyn local objectives (objectives.py): client terms, node state, server step,
wiring into every method, end to end."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedtune_app.config import ConfigError
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.objectives import LocalObjective
from fedtune_app.federated.strategy import ClientInfo, RoundLog
from fedtune_app.federated.wire import TrainTask
from fedtune_app.methods import resolve_config
from fedtune_app.methods.baselines import AllLarge
from fedtune_app.methods.inclusivefl import InclusiveFL
from floats import float32_atol


def cfg(**keys):
    return resolve_config({"preset": "smoke", **keys})


def f32(*v):
    return np.array(v, dtype=np.float32)


def context():
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def sgd_steps(objective, w, steps, lr, task_grad):
    """``steps`` plain SGD steps on <c, w> + the objective's penalty."""
    opt = torch.optim.SGD([w], lr=lr)
    c = torch.tensor(task_grad)
    for _ in range(steps):
        loss = (c * w).sum() + objective.penalty()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_fedprox_two_sgd_steps_by_hand():
    objective = LocalObjective(cfg(**{"local-objective": "fedprox", "fedprox-mu": 0.1}))
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))  # what the server sent: theta_global
    objective.begin({"w": w}, context())
    # step 1: no drift yet, gradient = c = [1, -1] -> w = [0.5, 2.5] (lr 0.5)
    # step 2: gradient = c + mu (w - theta_g) = [1 - 0.05, -1 + 0.05] -> w = [0.025, 2.975]
    sgd_steps(objective, w, 2, 0.5, [1.0, -1.0])
    # 0.025 comes out of a cancellation (0.5 - 0.475), so rtol alone is not enough: each float32
    # step w - lr (c + mu (w - theta_g)) sums 4 products of up to 3 factors, none above 2.5
    np.testing.assert_allclose(w.detach().numpy(), [0.025, 2.975], rtol=0,
                               atol=2 * float32_atol(2.5, 1.0, 1.0, terms=4))
    assert objective.penalty().item() == pytest.approx(0.05 * (0.975 ** 2 * 2))


def test_plain_objective_adds_nothing():
    objective = LocalObjective(cfg())
    w = torch.nn.Parameter(torch.tensor([1.0]))
    objective.begin({"w": w}, context())
    assert objective.penalty() == 0.0


def test_feddyn_client_state_across_two_rounds():
    config = cfg(**{"local-objective": "feddyn", "feddyn-alpha": 0.5})
    ctx = context()
    # round 1: h = 0; loss = <c, w> + alpha/2 ||w - g||^2; one step lr 1: w = [1, 2] - [1, -1]
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    objective = LocalObjective(config)
    objective.begin({"blocks.0.w": w}, ctx)
    sgd_steps(objective, w, 1, 1.0, [1.0, -1.0])
    objective.end({"blocks.0.w": w}, ctx)
    # h_i <- 0 - alpha (w - g) = -0.5 * ([0, 3] - [1, 2]) = [0.5, -0.5]
    key = "fedra-feddyn-h"
    np.testing.assert_allclose(ctx.state[key]["blocks.0.w"].numpy(), [0.5, -0.5])
    # round 2 from g = [0, 0]: gradient of the penalty at w = g is -h_i, so one step lr 1 with
    # task gradient 0 moves w to +h_i; h_i <- h_i - alpha (w - g) = [0.25, -0.25]
    w2, other = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    objective = LocalObjective(config)
    objective.begin({"blocks.0.w": w2, "head.b": other}, ctx)
    sgd_steps(objective, w2, 1, 1.0, [0.0, 0.0])
    np.testing.assert_allclose(w2.detach().numpy(), [0.5, -0.5])
    objective.end({"blocks.0.w": w2, "head.b": other}, ctx)
    np.testing.assert_allclose(ctx.state[key]["blocks.0.w"].numpy(), [0.25, -0.25])
    np.testing.assert_allclose(ctx.state[key]["head.b"].numpy(), [0.0])  # new, never moved


def clients(*examples):
    return [ClientInfo(100 + i, i, 2, n, f"client-{i}") for i, n in enumerate(examples)]


def test_feddyn_server_step_masked_by_holders():
    # N = 4 clients, 2 reply; 'a' held by both, 'b' by client 0 only, 'c' by nobody
    state = {"a": f32(0, 0), "b": f32(1), "c": f32(9)}
    strategy = AllLarge(cfg(**{"local-objective": "feddyn", "feddyn-alpha": 0.1}),
                        clients(10, 30, 5, 5), 2, state)
    updates = [ClientUpdate("0", {"a": f32(2, 4), "b": f32(3)}, 10),
               ClientUpdate("1", {"a": f32(6, 0)}, 30)]
    new = strategy.aggregate(updates)
    # mean a = [(20 + 180)/40, 40/40] = [5, 1]; h_a = -0.1 * 2/4 * [5, 1] = [-0.25, -0.05]
    np.testing.assert_allclose(strategy.h["a"], [-0.25, -0.05])
    np.testing.assert_allclose(new["a"], [5 + 2.5, 1 + 0.5])  # mean - h / alpha
    # b: mean 3, h_b = -0.1 * 1/4 * (3 - 1) = -0.05, b = 3 + 0.5
    np.testing.assert_allclose(strategy.h["b"], [-0.05])
    np.testing.assert_allclose(new["b"], [3.5])
    assert new["c"] == 9 and "c" not in strategy.h and new["a"].dtype == np.float32
    # round 2: client 0 returns 'a' unchanged: h_a stays, a moves by -h_a / alpha again
    strategy.state = new
    again = strategy.aggregate([ClientUpdate("0", {"a": new["a"]}, 10)])
    np.testing.assert_allclose(again["a"], [10, 2], rtol=1e-6)
    # the server state goes into the checkpoint and comes back
    fresh = AllLarge(strategy.cfg, clients(10, 30, 5, 5), 2, state)
    fresh.load_extra_state(strategy.extra_state())
    assert fresh.h.keys() == strategy.h.keys()
    np.testing.assert_array_equal(fresh.h["b"], strategy.h["b"])


def test_fedprox_and_plain_leave_the_server_mean_alone():
    state = {"a": f32(0, 0)}
    updates = [ClientUpdate("0", {"a": f32(2, 4)}, 10), ClientUpdate("1", {"a": f32(6, 0)}, 30)]
    for objective in ("plain", "fedprox"):
        strategy = AllLarge(cfg(**{"local-objective": objective}), clients(10, 30), 2, state)
        np.testing.assert_allclose(strategy.aggregate(updates)["a"], [5, 1])
        assert strategy.h == {} and strategy.extra_state() == {}


def test_inclusivefl_ends_with_the_feddyn_step():
    state = {"blocks.0.w": f32(0), "head.w": f32(0)}
    strategy = InclusiveFL(cfg(method="inclusivefl", **{"local-objective": "feddyn"}),
                           clients(10, 10), 1, state)
    strategy.history.append(RoundLog(1, plans={0: (0,), 1: (0,)}))
    new = strategy.aggregate([ClientUpdate("0", {"blocks.0.w": f32(1), "head.w": f32(2)}, 10),
                              ClientUpdate("1", {"blocks.0.w": f32(3), "head.w": f32(2)}, 10)])
    # mean 2, both of 2 clients held it: h = -0.1 * 2, theta = 2 + 2
    np.testing.assert_allclose(new["blocks.0.w"], [4])
    np.testing.assert_allclose(strategy.h["head.w"], [-0.2])


def test_depthfl_keys_and_contradiction():
    assert cfg(method="depthfl").objective == ("plain", 0)  # FedAvg, as FedRA ran it
    feddyn = {"depthfl-optimizer": "feddyn"}  # DepthFL's own paper
    assert cfg(method="depthfl", **feddyn).objective == ("feddyn", 0.1)
    assert cfg(method="depthfl", **feddyn, **{"depthfl-feddyn-alpha": 0.3}).objective == \
        ("feddyn", 0.3)
    assert cfg(method="depthfl", **{"depthfl-optimizer": "fedavg"}).objective == ("plain", 0)
    assert cfg(method="depthfl", **{"depthfl-optimizer": "fedavg",
                                                 "local-objective": "fedprox",
                                                 "fedprox-mu": 0.2}).objective == ("fedprox", 0.2)
    with pytest.raises(ConfigError, match="'depthfl-optimizer' = 'feddyn' and 'local-objective'"):
        cfg(method="depthfl", **feddyn, **{"local-objective": "fedprox"})
    with pytest.raises(ConfigError, match="allowed: plain, fedprox, feddyn"):
        cfg(**{"local-objective": "scaffold"})
    heterotune = {"method": "heterotune", "local-objective": "feddyn",
                  "model-groups": "vit_tiny_patch16_224", "model-group-args": "depth=2;depth=3"}
    with pytest.raises(ConfigError, match="not available with method 'heterotune'"):
        cfg(**heterotune)


def test_fedra_with_feddyn_end_to_end(tmp_path):
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.inprocess import InProcessGrid, simulation_nodes
    from fedtune_app.apps.server import run_federation

    rc = {"preset": "smoke", "results-dir": str(tmp_path), "method": "fedra",
          "local-objective": "feddyn"}
    grid = InProcessGrid(client_app, simulation_nodes(3), rc)
    folder = Path(run_federation(grid, resolve_config(rc)))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2] and not any(m["rejected"] for m in metrics)
    # each node keeps h_i for exactly the tensors it was ever sent (random FedRA plans)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    for node in grid.node_ids:
        sent = set().union(*(set(TrainTask.from_message(m).arrays) for m in train
                             if m.metadata.dst_node_id == node))
        assert set(grid.contexts[node].state["fedra-feddyn-h"]) == sent
