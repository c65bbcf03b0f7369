"""The comparison command: same config for every method, one table (Markdown + CSV), one plot."""

import csv
import json

import pytest

from fedtune_app.config import ConfigError
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
        assert float(line["average"]) == pytest.approx(100 * sum(groups.values()) / 3, abs=0.005)
        assert float(line["overall"]) == pytest.approx(100 * last["accuracy"], abs=0.005)
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
