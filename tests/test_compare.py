"""The comparison command: same config for every method, one table (Markdown + CSV), one plot."""

import csv
import json

import pytest

from fedtune_app.tools.compare import compare
from fedtune_app.config import ConfigError


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
