"""The notebooks execute headless on the smoke preset (so they never rot), and are committed
without outputs. Executing needs nbclient + ipykernel (see the notebooks' README)."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_are_committed_without_outputs(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells and all(c["outputs"] == [] and c["execution_count"] is None for c in cells)


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    # nbclient and ipykernel are in requirements.lock: `make setup` installs them
    import ipykernel  # noqa: F401
    import nbclient  # noqa: F401

    from fedtune_app.tools.notebook_runner import execute

    monkeypatch.setenv("FEDTUNE_PRESET", "smoke")
    monkeypatch.setenv("FEDTUNE_RESULTS_DIR", str(tmp_path))
    return lambda name: execute(NOTEBOOKS / f"{name}.ipynb")


WIDGET = "application/vnd.jupyter.widget-view+json"


def progress_outputs(nb) -> tuple[int, list[str]]:
    """(outputs that are Jupyter widgets, texts of stderr streams) of an executed notebook."""
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    widgets = sum(WIDGET in o.get("data", {}) for o in outputs)
    return widgets, [o.get("text", "") for o in outputs if o.get("name") == "stderr"]


def test_compare_strategies_notebook(run_notebook, tmp_path, monkeypatch):
    from fedtune_app.tools import analysis

    nb = run_notebook("compare_strategies")
    # tqdm.auto draws its progress bar as a widget (ipywidgets installed), not as text
    widgets, errors = progress_outputs(nb)
    assert widgets >= 1
    assert not any("IProgress not found" in e for e in errors)
    runs = analysis.load_runs(tmp_path)
    assert sorted(r.method for r in runs) == ["all-large", "all-small", "fedra"]
    # the notebook's table, recomputed from each run's metrics.json: one seed per method, so a
    # cell is 100 x that run's last evaluated accuracy per client group, its headline accuracy
    # ("test accuracy") and the accuracy over all test examples ("overall")
    expected = {}
    for run in runs:
        records = json.loads((run.folder / "metrics.json").read_text())
        last = [r for r in records if r.get("accuracy") is not None][-1]
        groups = last["accuracy-per-group"]
        cells = groups | {"test accuracy": last["accuracy"], "overall": last["accuracy-pooled"]}
        expected |= {(run.method, column): 100 * v for column, v in cells.items()}
    written = pd.read_csv(tmp_path / "table.csv")
    assert sorted(zip(written["method"], written["column"])) == sorted(expected)
    for method, column, mean in zip(written["method"], written["column"], written["mean"]):
        # a mean of at most 3 groups in float64, then x 100: a few units of the last place
        assert mean == pytest.approx(expected[(method, column)], rel=1e-12), (method, column)
    assert "<u>" in (tmp_path / "table.md").read_text()
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(
        ["accuracy-per-round.png", "accuracy-vs-bytes.png", "accuracy-per-group.png",
         "layer-coverage.png"] + [f"{kind}-{m}.png" for kind in ("allocation", "tsne")
                                  for m in ("fedra", "all-large", "all-small")])
    # given those runs' folders as its parameter, it compares them instead of running again
    again = tmp_path / "again"
    monkeypatch.setenv("FEDTUNE_RESULTS_DIR", str(again))
    monkeypatch.setenv("FEDTUNE_LOAD_FROM", os.pathsep.join(str(r.folder) for r in runs))
    run_notebook("compare_strategies")
    assert sorted(p.name for p in again.iterdir()) == ["plots", "table.csv", "table.md"]
    compared = pd.read_csv(again / "table.csv")
    assert dict(zip(zip(compared["method"], compared["column"]), compared["mean"])) == \
        dict(zip(zip(written["method"], written["column"]), written["mean"]))


def test_scenario_sweep_notebook(run_notebook, tmp_path):
    run_notebook("scenario_sweep")
    table = pd.read_csv(tmp_path / "table.csv")
    assert sorted(set(zip(table["scenario"], table["method"]))) == [
        ("dirichlet-alpha=0.1", "all-small"), ("dirichlet-alpha=0.1", "fedra"),
        ("dirichlet-alpha=100.0", "all-small"), ("dirichlet-alpha=100.0", "fedra")]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "accuracy-per-round.png", "accuracy-vs-alpha.png", "label-counts.png"]
