"""The server's round loop and its refusals, in-process (the real ServerApp logic and
ClientApp): capacities the nodes declare, rounds without evaluation, no checkpoint with
checkpoint-every = 0, and the DP budget of a round that samples some of the clients."""

import json
from pathlib import Path

import pytest

from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.config import ConfigError
from fedtune_app.federated.checkpoint import FILE
from fedtune_app.federated.robust import dp_epsilon
from fedtune_app.methods import resolve_config
from inprocess import InProcessGrid
from runs import TINY


def declared(*capacities) -> list[dict]:
    """Node configs of devices that declare their own capacity (deployment)."""
    return [{"partition-id": p, "num-partitions": len(capacities), "capacity": c}
            for p, c in enumerate(capacities)]


def test_declared_capacities_sampling_and_rounds_without_evaluation(tmp_path):
    # the smoke model has 4 blocks; the preset says 4,2,1 but the devices declare 3,1,2
    rc = TINY | {"results-dir": str(tmp_path), "num-server-rounds": 3, "eval-every": 2,
                 "checkpoint-every": 0, "clients-per-round": 2, "dp-noise-multiplier": 1.0,
                 "dp-noise-seed": 5}
    cfg = resolve_config(rc)
    folder = Path(run_federation(InProcessGrid(client_app, declared(3, 1, 2), rc), cfg))
    metrics = json.loads((folder / "metrics.json").read_text())
    # evaluated in round 2 (2 % 2 == 0) and in the last round 3 only
    assert [m["round"] for m in metrics] == [1, 2, 3]
    assert [m["accuracy"] is None for m in metrics] == [True, False, False]
    assert not (folder / FILE).exists()  # checkpoint-every = 0: none, not even at the end
    # every sampled client holds exactly the number of blocks it declared
    allocation = json.loads((folder / "allocation.json").read_text())
    for entry in allocation:
        rows = dict(zip(entry["clients"], entry["matrix"]))
        assert len(rows) == 2  # clients-per-round
        assert {p: sum(row) for p, row in rows.items()} == {
            p: {0: 3, 1: 1, 2: 2}[p] for p in rows}
    # the DP budget: 2 of the 3 clients per round, sampling rate 2/3, not 1
    for r, m in enumerate(metrics, 1):
        assert m["dp-epsilon"] == pytest.approx(dp_epsilon(cfg.robust, r, 2 / 3), rel=1e-12)
        assert m["dp-epsilon"] < dp_epsilon(cfg.robust, r, 1.0)


def test_a_node_declaring_more_blocks_than_the_model_has_stops_the_run(tmp_path):
    rc = TINY | {"results-dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"client 1 has capacity 5; allowed: 1\.\.4 "
                                          r"\(the model has 4 blocks\)"):
        run_federation(InProcessGrid(client_app, declared(4, 5), rc), resolve_config(rc))
