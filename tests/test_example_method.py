"""The worked example of docs/writing-a-method.md, examples/fedra_rare.py: one file
registers a method that runs end to end, allocation checked by hand."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fedtune_app import config
from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.config import ConfigError
from fedtune_app.methods import METHODS, resolve_config

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fedra_rare.py"


@pytest.fixture
def fedra_rare():
    """Import the example (it registers itself); afterwards the registry is as before, so the
    other tests (pyproject.toml lists every registered key) never see it."""
    registries = METHODS, config.KEYS, config.KEY_OWNERS, config.METHOD_PARTS
    before = [dict(registry) for registry in registries]
    spec = importlib.util.spec_from_file_location("fedra_rare_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    for registry, saved in zip(registries, before):
        registry.clear()
        registry.update(saved)


def test_two_rounds_give_every_client_its_least_trained_blocks(fedra_rare, tmp_path):
    # power 60: a block trained once more than another is 2^-60 times as likely, so each plan
    # must take the least trained blocks first (ties broken by the seeded draw)
    folder = Path(run_inprocess({"preset": "smoke", "method": "fedra-rare", "train-subset": 240,
                                 "test-subset": 50, "fedra-rare-power": 60.0,
                                 "results-dir": str(tmp_path)}))
    rounds = json.loads((folder / "allocation.json").read_text())
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(m["rejected"] == {} and m["state-updated"] for m in metrics)
    counts = np.zeros(4)  # smoke: a 4-block Mixer, clients of capacity 4, 2, 1
    for r in rounds:
        assert r["clients"] == [0, 1, 2]
        for row, capacity in zip(r["matrix"], [4, 2, 1]):
            held = np.array(row, dtype=bool)
            assert held.sum() == capacity
            if capacity < 4:
                assert counts[held].max() <= counts[~held].min(), (r["round"], row, counts)
            counts += held
    # by hand: round 1 gives counts 1 1 1 1 (4-block client), 2 2 1 1 (2-block), then the
    # 1-block client takes a 1: {2, 2, 2, 1}. Round 2: {3, 3, 3, 2}; the 2-block client must take
    # the 2 and one 3 -> {4, 3, 3, 3}; the last client a 3 -> {4, 4, 3, 3}
    first, second = np.array(rounds[0]["matrix"]), np.array(rounds[1]["matrix"])
    assert sorted(first.sum(0)) == [1, 2, 2, 2]
    assert second[1][first.sum(0).argmin()] == 1  # the least trained block goes to client 1
    assert sorted(counts) == [3, 3, 4, 4]


def test_its_key_and_its_check_work_like_any_method(fedra_rare):
    cfg = resolve_config({"preset": "smoke", "method": "fedra-rare"})
    assert cfg.own.fedra_rare_power == 1.0
    assert METHODS["fedra-rare"].strategy is fedra_rare.FedRARare
    with pytest.raises(ConfigError, match="'fedra-rare-power' = -1.0 is below its minimum 0"):
        resolve_config({"method": "fedra-rare", "fedra-rare-power": -1.0})
    with pytest.raises(ConfigError, match="'missing-layer-policy' = 'cover-all'.*fedra-rare"):
        resolve_config({"method": "fedra-rare", "missing-layer-policy": "cover-all"})
