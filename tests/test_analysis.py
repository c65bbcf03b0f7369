"""The results API on hand-made results folders (numbers worked out by hand), and on real
smoke runs (the rebuilt global model must reproduce the accuracy the run recorded)."""

import json

import numpy as np
import pytest

from fedtune_app.tools import analysis
from floats import float32_atol, float64_atol

BASE = {"method": "fedra", "seed": 0, "dataset": "digits", "dirichlet-alpha": 0.5,
        "capacities": "4,2,1", "missing-layer-policy": "keep-previous", "results-dir": "/x",
        "device": "auto"}


def make_run(root, name, final, config=None, rounds=None, allocation=None, clients=None):
    """A results folder. ``final`` = (overall accuracy, {group: accuracy}) of the last round;
    ``rounds`` = [(accuracy or None, bytes-down, bytes-up)] before it."""
    folder = root / name
    folder.mkdir(parents=True)
    metrics = [{"round": i + 1, "accuracy": acc, "accuracy-per-group": None, "loss": None,
                "train-loss": 1.0, "bytes-down": down, "bytes-up": up, "seconds": 2.0}
               for i, (acc, down, up) in enumerate(rounds or [])]
    metrics.append({"round": len(metrics) + 1, "accuracy": final[0],
                    "accuracy-per-group": final[1], "loss": 0.5, "train-loss": 0.4,
                    "bytes-down": 100, "bytes-up": 60, "seconds": 3.0})
    (folder / "config.json").write_text(json.dumps(
        {"run-config": BASE | (config or {}), "clients": clients or []}))
    (folder / "metrics.json").write_text(json.dumps(metrics))
    if allocation is not None:
        (folder / "allocation.json").write_text(json.dumps(allocation))
    return folder


@pytest.fixture
def table_runs(tmp_path):
    """fedra with two seeds, two competitors, one ceiling; groups a and b."""
    make_run(tmp_path, "fedra-0", (0.70, {"a": 0.80, "b": 0.60}))
    make_run(tmp_path, "fedra-1", (0.78, {"a": 0.90, "b": 0.70}), {"seed": 1})
    make_run(tmp_path, "small", (0.69, {"a": 0.70, "b": 0.66}), {"method": "all-small"})
    make_run(tmp_path, "incl", (0.64, {"a": 0.60, "b": 0.68}), {"method": "inclusivefl"})
    make_run(tmp_path, "large", (0.80, {"a": 0.95, "b": 0.50}), {"method": "all-large"})
    return tmp_path


def test_paper_table_mean_std_best_competitor_and_deltas(table_runs):
    table = analysis.paper_table(analysis.load_runs(table_runs), proposed="fedra")
    fedra = table.mean.loc[("-", "fedra")]
    # a: (80+90)/2; b: (60+70)/2; the headline is each run's own accuracy: (70+78)/2 (these
    # records have no accuracy-pooled, so overall is the same), not the mean of a and b (75)
    assert fedra.to_dict() == pytest.approx(
        {"a": 85.0, "b": 65.0, "test accuracy": 74.0, "overall": 74.0})
    # sample std of two values x, y is |x - y| / sqrt(2)
    assert table.std.loc[("-", "fedra")].to_dict() == pytest.approx(
        {"a": 10 / 2 ** 0.5, "b": 10 / 2 ** 0.5, "test accuracy": 8 / 2 ** 0.5,
         "overall": 8 / 2 ** 0.5})
    assert table.seeds.loc[("-", "fedra"), "a"] == 2
    # best competitor per column, never the ceiling (all-large has a = 95):
    # a: all-small 70 > 60; b: inclusivefl 68 > 66; headline and overall: all-small 69 > 64
    best = {col: table.best.index[table.best[col]].get_level_values("method").tolist()
            for col in table.best.columns}
    assert best == {"a": ["all-small"], "b": ["inclusivefl"], "test accuracy": ["all-small"],
                    "overall": ["all-small"]}
    assert table.delta.loc[("-", "fedra")].to_dict() == pytest.approx(
        {"a": 15.0, "b": -3.0, "test accuracy": 5.0, "overall": 5.0})
    assert table.delta.drop(("-", "fedra")).isna().all().all()

    cells = table.cells()
    assert cells.loc[("-", "fedra"), "a"] == "85.00 ± 7.07 (+15.00)"
    assert cells.loc[("-", "fedra"), "b"] == "65.00 ± 7.07 (-3.00)"
    assert cells.loc[("-", "all-small"), "a"] == "<u>70.00</u>"  # one seed: no ± std
    assert cells.loc[("-", "all-large"), "a"] == "95.00"

    markdown = table.to_markdown()
    header, rule, *rows = markdown.splitlines()[:6]
    assert [c.strip() for c in header.split("|")[1:-1]] == \
        ["method", "a", "b", "test accuracy", "overall"]
    assert rule.startswith("|------")
    assert any(r.startswith("| inclusivefl | 60.00") and "<u>68.00</u>" in r for r in rows)


def test_paper_table_csv_is_tidy_numbers(table_runs, tmp_path):
    table = analysis.paper_table(analysis.load_runs(table_runs))
    table.to_csv(tmp_path / "t.csv")
    import pandas as pd

    frame = pd.read_csv(tmp_path / "t.csv")
    assert list(frame.columns) == ["scenario", "method", "column", "mean", "std", "seeds",
                                   "best", "delta"]
    row = frame[(frame.method == "fedra") & (frame.column == "overall")].iloc[0]
    assert (row["mean"], row["seeds"], row["delta"]) == (pytest.approx(74.0), 2, pytest.approx(5.0))
    assert len(frame) == 4 * 4  # 4 methods x (a, b, test accuracy, overall)


def test_without_the_proposed_method_there_are_no_deltas(table_runs):
    runs = [r for r in analysis.load_runs(table_runs) if r.method != "fedra"]
    table = analysis.paper_table(runs, proposed="fedra")
    assert table.delta.isna().all().all()
    assert "no run of the proposed method 'fedra'" in table.to_markdown()


def test_table_says_when_runs_end_at_different_rounds(tmp_path):
    make_run(tmp_path, "fedra", (0.5, {"a": 0.5}), rounds=[(0.3, 1, 1)])
    make_run(tmp_path, "small", (0.4, {"a": 0.4}), {"method": "all-small"})
    table = analysis.paper_table(analysis.load_runs(tmp_path))
    assert "(not the same last evaluated round: fedra 2, all-small 1)" in table.to_markdown()


def test_rounds_table_cumulates_bytes_and_keeps_unevaluated_rounds(tmp_path):
    make_run(tmp_path, "r", (0.5, {"a": 0.5}), rounds=[(None, 100, 50), (0.3, 100, 60)])
    rounds = analysis.rounds_table(analysis.load_runs(tmp_path))
    assert rounds["round"].tolist() == [1, 2, 3]
    assert rounds["comm_bytes"].tolist() == [150, 310, 470]  # + (100 + 60) in the last round
    assert np.isnan(rounds["accuracy"].iloc[0]) and rounds["accuracy"].iloc[1] == 0.3
    final = analysis.final_table(analysis.load_runs(tmp_path))
    assert final[["round", "accuracy", "avg", "comm_bytes", "seconds"]].iloc[0].tolist() == \
        [3, 0.5, 0.5, 470, 7.0]


def test_scenarios_are_the_keys_that_differ_and_method_keys_name_variants(tmp_path):
    make_run(tmp_path, "a", (0.5, {}), {"dirichlet-alpha": 0.1, "results-dir": "/p"})
    make_run(tmp_path, "b", (0.5, {}), {"dirichlet-alpha": 100.0, "results-dir": "/q"})
    make_run(tmp_path, "c", (0.5, {}), {"dirichlet-alpha": 0.1,
                                        "missing-layer-policy": "cover-all"})
    runs = {r.name: r for r in analysis.load_runs(tmp_path, method_keys=["missing-layer-policy"])}
    assert {n: (r.method, r.scenario) for n, r in runs.items()} == {
        "a": ("fedra[missing-layer-policy=keep-previous]", "dirichlet-alpha=0.1"),
        "b": ("fedra[missing-layer-policy=keep-previous]", "dirichlet-alpha=100.0"),
        "c": ("fedra[missing-layer-policy=cover-all]", "dirichlet-alpha=0.1")}
    # without method_keys the policy is part of the scenario
    plain = {r.name: r.scenario for r in analysis.load_runs(tmp_path)}
    assert plain["c"] == "dirichlet-alpha=0.1, missing-layer-policy=cover-all"


def test_allocation_counts_coverage_and_gamma_star(tmp_path):
    clients = [{"partition_id": p, "capacity": c, "label_counts": [1, 2]}
               for p, c in enumerate([4, 2, 1])]
    make_run(tmp_path, "fedra", (0.5, {}), clients=clients, allocation=[
        {"round": 1, "clients": [0, 1, 2],
         "matrix": [[1, 1, 1, 1], [1, 0, 0, 1], [0, 0, 0, 1]]},
        {"round": 2, "clients": [0, 2], "matrix": [[1, 1, 1, 1], [0, 1, 0, 0]]}])
    make_run(tmp_path, "small", (0.5, {}), {"method": "all-small"}, clients=clients,
             allocation=[{"round": t, "clients": [0, 1, 2], "matrix": [[1, 1, 0, 0]] * 3}
                         for t in (1, 2)])
    runs = {r.name: r for r in analysis.load_runs(tmp_path)}
    counts = analysis.allocation_counts(runs["fedra"])
    assert counts.to_numpy().tolist() == [[2, 2, 2, 2], [1, 0, 0, 1], [0, 1, 0, 1]]
    coverage = analysis.coverage_table(list(runs.values()))
    fedra = coverage[coverage.run == "fedra"].pivot(index="round", columns="block",
                                                    values="gamma")
    assert fedra.to_numpy().tolist() == [[2, 1, 1, 3], [1, 2, 1, 1]]  # column sums
    # Gamma*: the smallest Gamma over rounds and TRAINED blocks (all-small's zeros excluded)
    assert analysis.gamma_star(coverage).to_dict() == {"fedra": 1, "small": 3}
    fig = analysis.plot_coverage(coverage)
    assert sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts()) == \
        ["all-small (Γ*=3)", "fedra (Γ*=1)"]
    fig = analysis.plot_allocation(runs["fedra"])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == \
        ["client 0 (L=4)", "client 1 (L=2)", "client 2 (L=1)"]


def test_accuracy_plots_show_means_over_seeds_in_percent_and_megabytes(tmp_path):
    make_run(tmp_path, "s0", (0.6, {"a": 0.6}), rounds=[(0.2, 1_000_000, 1_000_000)])
    make_run(tmp_path, "s1", (0.8, {"a": 0.8}), {"seed": 1},
             rounds=[(0.4, 1_000_000, 1_000_000)])
    rounds = analysis.rounds_table(analysis.load_runs(tmp_path))
    line = analysis.plot_accuracy(rounds).axes[0].lines[0]
    assert line.get_label() == "fedra"
    assert line.get_xdata().tolist() == [1, 2]
    assert line.get_ydata() == pytest.approx([30.0, 70.0])
    line = analysis.plot_accuracy_vs_bytes(rounds).axes[0].lines[0]
    assert line.get_xdata() == pytest.approx([2.0, 2.00016])  # MB, down + up, cumulative


def test_cli_prints_the_table_and_writes_csv_markdown_and_plots(table_runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert analysis.main(["compare", str(table_runs), "--csv", str(out / "t.csv"),
                          "--markdown", str(out / "t.md"), "--plots", str(out / "plots")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("5 runs: all-large, all-small, fedra, inclusivefl")
    assert "85.00 ± 7.07 (+15.00)" in printed and "_70.00_" in printed
    assert "<u>70.00</u>" in (out / "t.md").read_text()
    assert (out / "t.csv").is_file()
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "accuracy-per-group.png", "accuracy-per-round.png", "accuracy-vs-bytes.png"]


def test_cli_names_a_folder_that_is_not_a_results_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        analysis.main(["compare", str(tmp_path / "empty")])
    assert exit_.value.code == 2
    assert "empty: no results folder (no metrics.json) in it" in capsys.readouterr().err
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "metrics.json").write_text("[]")
    with pytest.raises(FileNotFoundError, match="half is not a results folder: it has no "
                                                "config.json"):
        analysis.load_runs(tmp_path / "half")


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """Real in-process federations (smoke preset): FedRA and AllSmall (prefix eval plan)."""
    from fedtune_app.apps.inprocess import run_inprocess

    root = tmp_path_factory.mktemp("smoke")
    folders = [run_inprocess({"preset": "smoke", "method": m, "results-dir": str(root)})
               for m in ("fedra", "all-small")]
    return analysis.load_runs(*folders)


def test_rebuilt_global_model_reproduces_the_recorded_accuracy(smoke_runs):
    """Features of the model rebuilt from config.json + state.safetensors, through the saved
    head, classify the whole test set exactly as the server's evaluation did."""
    from safetensors.numpy import load_file

    for run in smoke_runs:
        feats, labels, names = analysis.global_features(run, num_examples=10_000)
        state = load_file(str(run.folder / "state.safetensors"))
        weight, bias = state["head.weight"], state["head.bias"]
        logits = feats @ weight.T + bias
        assert len(labels) == 100 and names == [str(d) for d in range(10)]
        # the same features (same code, same batches), but this head sums its d products and
        # the bias in numpy's order, the server's in torch's: an example whose two best logits
        # are closer than twice that float32 bound may be classified either way
        bound = float32_atol(max(1.0, np.abs(feats).max()),
                             max(np.abs(weight).max(), np.abs(bias).max()),
                             terms=weight.shape[1] + 1)
        best_two = np.sort(logits, axis=1)[:, -2:]
        near_ties = int((best_two[:, 1] - best_two[:, 0] <= 2 * bound).sum())
        accuracy = (logits.argmax(1) == labels).mean()
        recorded = analysis.final_record(run)["accuracy"]  # a float64 fraction, summed its way
        assert abs(accuracy - recorded) <= near_ties / len(labels) + \
            float64_atol(1.0, terms=len(labels))


def test_tsne_plot_of_a_real_run_and_all_plots_as_files(smoke_runs, tmp_path):
    fig = analysis.plot_tsne(smoke_runs[0], num_examples=50)
    ax = fig.axes[0]
    assert sum(len(c.get_offsets()) for c in ax.collections) == 50  # stratified: 5 per class
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [str(d) for d in range(10)]
    files = analysis.save_plots(smoke_runs, tmp_path, tsne=False)
    assert sorted(p.name for p in files) == [
        "accuracy-per-group.png", "accuracy-per-round.png", "accuracy-vs-bytes.png",
        "allocation-all-small.png", "allocation-fedra.png", "layer-coverage.png"]
    assert all(p.stat().st_size > 10_000 for p in files)


def write_results(root, name, config, record, clients):
    """A results folder as ResultsWriter writes it: config.json and a one-round metrics.json."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run-config": BASE | config,
                                                    "clients": clients}))
    (folder / "metrics.json").write_text(json.dumps([{"round": 1, "bytes-down": 100,
                                                      "bytes-up": 60, "seconds": 1.0} | record]))
    return folder


CLIENTS = [{"partition_id": p, "group": f"client-{p}", "capacity": c, "label_counts": [1, 1]}
           for p, c in enumerate([3, 2, 1, 1])]


def test_compare_and_analyze_show_the_same_headline_under_the_same_name(tmp_path):
    from fedtune_app.tools import compare

    # a HeteroTune run as GroupedEvaluator records it: client 0 runs the large model (group 1),
    # the others the small one; accuracy = mean over the model groups (80 + 87.5) / 2 = 83.75,
    # while the mean over the clients' columns is (85 + 90 + 95 + 95) / 4 = 91.25
    heterotune = write_results(tmp_path, "heterotune", {"method": "heterotune"}, {
        "accuracy": 0.8375, "accuracy-pooled": 0.83,
        "accuracy-per-model-group": {"0": 0.80, "1": 0.875},
        "accuracy-smallest": 0.80, "accuracy-largest": 0.875,
        "accuracy-per-group": {"0/client-1": 0.90, "0/client-2": 0.95, "0/client-3": 0.95,
                               "1/client-0": 0.85}}, CLIENTS)
    # a depth run without domains: its headline is its accuracy over all test examples
    fedra = write_results(tmp_path, "fedra", {}, {
        "accuracy": 0.70, "accuracy-pooled": 0.70,
        "accuracy-per-group": {f"client-{p}": a for p, a in enumerate([0.6, 0.7, 0.8, 0.9])}},
        CLIENTS)
    rows = [compare.summarize("heterotune", heterotune), compare.summarize("fedra", fedra)]
    compare.write_table(rows, compare.group_labels(fedra), tmp_path, "test")
    header, _, *lines = (tmp_path / "compare.md").read_text().splitlines()[:4]
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "method", "client-0 (L=3)", "client-1 (L=2)", "client-2 (L=1)", "client-3 (L=1)",
        "test accuracy", "overall"]
    assert lines[0] == "| heterotune | 85.00 | 90.00 | 95.00 | 95.00 | 83.75 | 83.00 |"
    assert lines[1] == "| fedra | 60.00 | 70.00 | 80.00 | 90.00 | 70.00 | 70.00 |"

    table = analysis.paper_table(analysis.load_runs(tmp_path / "heterotune", tmp_path / "fedra"),
                                 proposed=None)
    assert table.mean.loc[("-", "heterotune"), "test accuracy"] == pytest.approx(83.75)
    assert table.mean.loc[("-", "fedra"), "test accuracy"] == pytest.approx(70.0)
    # the group run's clients are the same columns as the depth run's: no "0/client-1"
    assert list(table.mean.columns) == ["client-0", "client-1", "client-2", "client-3",
                                        "test accuracy", "overall"]
    assert table.mean.loc[("-", "heterotune"), "client-0"] == pytest.approx(85.0)


def test_analyze_shows_only_the_columns_that_have_values(tmp_path):
    # two scenarios (dirichlet-alpha differs): domains a, b in one, domain c in the other
    make_run(tmp_path, "x", (0.5, {"a": 0.4, "b": 0.6}))
    make_run(tmp_path, "y", (0.7, {"c": 0.7}), {"dirichlet-alpha": 0.1})
    table = analysis.paper_table(analysis.load_runs(tmp_path), proposed=None)
    assert table.mean.shape[1] == 5  # a, b, c, test accuracy, overall over both scenarios
    headers = [line for line in table.to_markdown().splitlines() if line.startswith("| method")]
    assert [[c.strip() for c in h.split("|")[1:-1]] for h in headers] == [
        ["method", "a", "b", "test accuracy", "overall"],
        ["method", "c", "test accuracy", "overall"]]
    assert "| - " not in table.to_markdown() and " - |" not in table.to_markdown()
    long = table.long()  # the CSV: no row for a column the scenario does not have
    assert sorted(zip(long["scenario"], long["column"])) == sorted(
        [("dirichlet-alpha=0.5", c) for c in ("a", "b", "test accuracy", "overall")]
        + [("dirichlet-alpha=0.1", c) for c in ("c", "test accuracy", "overall")])
