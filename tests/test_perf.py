"""What the performance benchmarks rely on: the frozen backbone is built once per process (not
per round or per client) and every round records the clients' process facts."""

import json
from pathlib import Path

import torch

from fedtune_app.apps import client
from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.config import app_defaults
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import BUILDS
from inprocess import InProcessGrid, simulation_nodes


def test_backbone_built_once_per_process_and_round_records_process_facts(tmp_path):
    rc = {**app_defaults(), "preset": "smoke", "results-dir": str(tmp_path)}
    client._MODELS.clear()  # a fresh process: no backbone cached yet
    before = BUILDS["count"]
    folder = Path(run_federation(InProcessGrid(client_app, simulation_nodes(3), rc),
                                 resolve_config(rc)))
    # one process here: the server's model + ONE client backbone shared by 3 clients x 2 rounds
    # (building per message would make it 1 + 6)
    assert BUILDS["count"] - before == 2
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [sorted(m["client-metrics"]) for m in metrics] == [["0", "1", "2"]] * 2
    for m in metrics:
        assert m["server"]["backbone-builds"] == BUILDS["count"] and m["server"]["peak-rss-mb"] > 0
        for cm in m["client-metrics"].values():
            assert cm["backbone-builds"] == BUILDS["count"]  # unchanged from round 1 to 2
            assert cm["torch-threads"] == torch.get_num_threads()
            assert 0 < cm["fit-seconds"] <= cm["train-seconds"]
    assert m["started"] > metrics[0]["started"]
