"""The comparison command: same config for every method, one table (Markdown + CSV), one plot."""

import csv
import json
from pathlib import Path

import pytest

from fedtune_app.config import ConfigError, app_defaults
from fedtune_app.methods import resolve_config
from fedtune_app.tools import analysis
from fedtune_app.tools.compare import compare


def test_unknown_method_fails_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="'fedavg' is not an available method"):
        compare(["fedra", "fedavg"], {"preset": "smoke"}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_table_rows_are_the_runs_last_evaluations(tmp_path):
    rows = compare(["all-small", "depthfl"], {"preset": "smoke", "num-server-rounds": 1},
                   tmp_path, command="test")
    with (tmp_path / "compare.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["method"] for r in table] == ["all-small", "depthfl"]
    assert list(table[0])[1:4] == ["client-0 (L=4)", "client-1 (L=2)", "client-2 (L=1)"]
    for row, line in zip(rows, table):
        last = json.loads((tmp_path / "runs" / row["folder"].split("/")[-1] /
                           "metrics.json").read_text())[-1]
        groups = last["accuracy-per-group"]
        assert float(line["client-1 (L=2)"]) == pytest.approx(100 * groups["client-1"], abs=0.005)
        assert float(line["test accuracy"]) == pytest.approx(100 * last["accuracy"], abs=0.005)
        assert float(line["overall"]) == pytest.approx(100 * last["accuracy-pooled"], abs=0.005)
    # both runs used the same split: the same label counts per client
    configs = [json.loads((tmp_path / "runs" / r["folder"].split("/")[-1] / "config.json")
                          .read_text())["clients"] for r in rows]
    assert configs[0] == configs[1]
    assert "accuracy-last-exit" in table[1]["extras"]
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert "| depthfl |" in (tmp_path / "compare.md").read_text()


def test_several_seeds_give_one_row_per_run_and_mean_and_std_per_method(tmp_path):
    compare(["all-small"], {"preset": "smoke", "num-server-rounds": 1}, tmp_path,
            command="test", seeds=[0, 3])
    with (tmp_path / "compare.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [(r["method"], r["seed"]) for r in table] == [("all-small", "0"), ("all-small", "3")]
    runs = sorted((tmp_path / "runs").iterdir())
    seeds = {json.loads((r / "config.json").read_text())["run-config"]["seed"] for r in runs}
    assert seeds == {0, 3}
    a, b = (float(r["overall"]) for r in table)
    # two values: mean (a+b)/2, sample std |a-b|/sqrt(2); the CSV's values are rounded to 0.005
    row = next(line for line in (tmp_path / "compare.md").read_text().splitlines()
               if line.startswith("| all-small |"))
    mean, std = map(float, row.split(" | ")[-1].rstrip(" |").split(" ± "))
    assert mean == pytest.approx((a + b) / 2, abs=0.01)
    assert std == pytest.approx(abs(a - b) / 2 ** 0.5, abs=0.01)
    assert "mean ± sample std over seeds 0, 3" in (tmp_path / "compare.md").read_text()


def test_repeated_seeds_are_refused_before_any_run(tmp_path):
    with pytest.raises(ConfigError, match="--seeds"):
        compare(["all-small"], {"preset": "smoke"}, tmp_path / "out", seeds=[1, 1])
    assert not (tmp_path / "out").exists()


def test_a_key_given_beside_a_preset_wins_even_at_pyprojects_value():
    # smoke runs 2 rounds, pyproject (the default) 5: a given 5 alone would look not given
    # beside the preset; compare names every given key in 'preset-overrides'
    from fedtune_app.tools.compare import run_config_of

    keys = run_config_of("all-small", {"preset": "smoke", "num-server-rounds": 5})
    assert keys["preset-overrides"] == "num-server-rounds,method"
    cfg = resolve_config({**app_defaults(), **keys})
    assert (cfg.method, cfg.federation.num_server_rounds) == ("all-small", 5)
    without = resolve_config({**app_defaults(), "preset": "smoke", "num-server-rounds": 5})
    assert without.federation.num_server_rounds == 2  # what plain `flwr run` would do


def test_one_fleet_runs_depth_rank_and_model_group_methods_in_one_table(tmp_path):
    """FedRA, HetLoRA and HeteroTune over preset smoke-fleet's 4 devices (3, 2, 1, 1 blocks of
    the larger of two tiny ViTs), one round each: one table, the headline compare and analyze
    agree on."""
    fleet = {"preset": "smoke-fleet", "num-server-rounds": 1}
    rows = compare(["fedra", "hetlora", "heterotune"], fleet, tmp_path, command="test")
    with (tmp_path / "compare.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["method"] for r in table] == ["fedra", "hetlora", "heterotune"]
    assert list(table[0])[1:7] == [f"client-{i} (capacity {c})" for i, c in
                                   enumerate([3, 2, 1, 1])] + ["test accuracy", "overall"]
    configs = [json.loads((Path(r["folder"]) / "config.json").read_text()) for r in rows]
    keys = [c["run-config"] for c in configs]
    # each method's own setting of the fleet (the hand-worked numbers: tests/test_fleet.py)
    assert [(k["capacities"], k["ranks"]) for k in keys[:2]] == [("3,2,1,1", ""),
                                                                ("3,3,3,3", "8,5,2,2")]
    assert (keys[2]["model-group-assign"], keys[2]["model-group-capacities"]) == ("capacity",
                                                                                   "1,3")
    assert [c["model_group"] for c in configs[2]["clients"]] == [1, 0, 0, 0]
    # the same clients: the same partitions, label counts and all
    assert len({json.dumps([c["label_counts"] for c in cfg["clients"]]) for cfg in configs}) == 1
    md = (tmp_path / "compare.md").read_text()
    assert "- hetlora: LoRA rank 8, 5, 2, 2 in all 3 blocks" in md
    assert "- heterotune: model group 1, 0, 0, 0 (0 = smallest)" in md
    # one headline: the run's own accuracy, in compare and in analyze, one scenario
    paper = analysis.paper_table(analysis.load_runs(tmp_path / "runs"), proposed=None)
    assert paper.mean.index.get_level_values("scenario").unique().tolist() == ["-"]
    for row, line in zip(rows, table):
        last = analysis.last_evaluated(json.loads(
            (Path(row["folder"]) / "metrics.json").read_text()))
        assert float(line["test accuracy"]) == pytest.approx(100 * last["accuracy"], abs=0.005)
        assert paper.mean.loc[("-", row["method"]), "test accuracy"] == pytest.approx(
            100 * last["accuracy"], rel=1e-12)
    assert list(paper.mean.columns) == [f"client-{i}" for i in range(4)] + ["test accuracy",
                                                                           "overall"]
