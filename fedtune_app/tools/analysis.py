"""Compare runs: results folders -> tidy pandas tables -> paper-style tables and plots.

    runs = load_runs("results/")                 # every results folder under the given paths
    rounds_table(runs)                           # one row per (run, round)
    groups_table(runs)                           # one row per (run, group), final evaluation
    table = paper_table(runs)                    # mean (± std over seeds) per method and group
    print(table.to_markdown())                   # best non-proposed underlined, deltas in ()

Runs are grouped by ``method`` and ``scenario``; seeds are repetitions. The scenario of a run is
the run-config keys that differ between the loaded runs (everything but the method, the seed
and keys that do not change results, such as ``results-dir``), e.g. ``dirichlet-alpha=0.1``;
runs over one ``fleet`` leave out the keys it sets for each method (``data.fleet``). Accuracies in
tables are percentages; std is the sample std over seeds (ddof=1). The headline column
(``HEADLINE``) is the one ``fedtune compare`` shows, from the same function (``result_columns``).

Command line (no Jupyter needed):
    python -m fedtune_app.tools.analysis compare results/ [--proposed fedra] [--csv t.csv] \
        [--plots DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedtune_app.config import KEYS
from fedtune_app.data.fleet import FLEET_KEYS

# Run-config keys that never make two runs incomparable.
NOT_SCENARIO = ("method", "seed", "results-dir", "preset", "device", "round-timeout",
                "min-nodes", "eval-batch-size", "eval-every")
DEFAULT_PROPOSED = KEYS["method"].default  # the method a run has unless told otherwise
RUN_FILES = ("config.json", "metrics.json")


@dataclass
class Run:
    """One results folder as written by ``results.ResultsWriter``."""

    folder: Path
    config: dict
    clients: list[dict]
    metrics: list[dict]
    allocation: list[dict]
    method: str = ""  # label, may carry variant keys: "fedra[missing-layer-policy=cover-all]"
    scenario: str = "-"
    class_names: tuple[str, ...] = ()  # the data set's, in label order (folders of older runs: ())

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    @property
    def name(self) -> str:
        return self.folder.name


def load_run(folder) -> Run:
    folder = Path(folder)
    for name in RUN_FILES:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} is not a results folder: it has no {name}")
    config = json.loads((folder / "config.json").read_text())
    allocation = folder / "allocation.json"  # written at the end: absent while a run is going
    return Run(folder, config["run-config"], config.get("clients", []),
               json.loads((folder / "metrics.json").read_text()),
               json.loads(allocation.read_text()) if allocation.is_file() else [],
               method=config["run-config"]["method"],
               class_names=tuple(config.get("class-names", ())))


def load_runs(*paths, method_keys=()) -> list[Run]:
    """Every results folder at or under ``paths`` (a folder holding ``metrics.json``, or any
    folder above such folders), labelled with its method and scenario.

    ``method_keys``: run-config keys that name a method variant rather than a scenario (e.g.
    ``missing-layer-policy``): they go into the method label when they vary."""
    folders = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such results folder: {path}")
        found = [path] if (path / "metrics.json").is_file() else \
            sorted(p.parent for p in path.rglob("metrics.json"))
        if not found:
            raise FileNotFoundError(f"{path}: no results folder (no metrics.json) in it")
        folders += found
    runs = [load_run(f) for f in dict.fromkeys(folders)]
    label_runs(runs, method_keys)
    return runs


def _varying(runs: list[Run], keys) -> list[str]:
    return [k for k in keys if len({json.dumps(r.config.get(k)) for r in runs}) > 1]


def _describe(config: dict, keys) -> str:
    return ", ".join(f"{k}={config.get(k)}" for k in keys)


def label_runs(runs: list[Run], method_keys=()) -> None:
    """Set each run's ``method`` and ``scenario`` labels from the keys that vary between runs."""
    all_keys = sorted({k for r in runs for k in r.config})
    # runs over one fleet: the keys it sets are each method's own setting, not a scenario
    derived = FLEET_KEYS if all(r.config.get("fleet") for r in runs) else ()
    variant = _varying(runs, [k for k in all_keys if k in method_keys])
    scenario = _varying(runs, [k for k in all_keys if k not in NOT_SCENARIO
                               and k not in method_keys and k not in derived])
    for r in runs:
        r.method = r.config["method"] + (f"[{_describe(r.config, variant)}]" if variant else "")
        r.scenario = _describe(r.config, scenario) or "-"


# -- tidy tables ---------------------------------------------------------------------------
def _ids(run: Run) -> dict:
    return {"scenario": run.scenario, "method": run.method, "seed": run.seed, "run": run.name}


def rounds_table(runs: list[Run]) -> pd.DataFrame:
    """One row per (run, round): accuracy (NaN where not evaluated), losses, bytes of the round
    and cumulated (``comm_bytes`` = down + up so far), seconds."""
    rows = []
    for run in runs:
        comm = 0
        for m in run.metrics:
            comm += m["bytes-down"] + m["bytes-up"]
            rows.append(_ids(run) | {
                "round": m["round"], "accuracy": _num(m.get("accuracy")),
                "loss": _num(m.get("loss")), "train_loss": _num(m.get("train-loss")),
                "bytes_down": m["bytes-down"], "bytes_up": m["bytes-up"], "comm_bytes": comm,
                "seconds": _num(m.get("seconds"))})
    return pd.DataFrame(rows, columns=["scenario", "method", "seed", "run", "round", "accuracy",
                                       "loss", "train_loss", "bytes_down", "bytes_up",
                                       "comm_bytes", "seconds"])


def _num(value) -> float:
    return float("nan") if value is None else float(value)


def final_record(run: Run) -> dict:
    """The last evaluated round's metrics record."""
    return last_evaluated(run.metrics, run.folder)


def last_evaluated(metrics: list[dict], folder="") -> dict:
    """The last record of a metrics.json list that has an accuracy."""
    evaluated = [m for m in metrics if m.get("accuracy") is not None]
    if not evaluated:
        raise ValueError(f"run {folder} has no evaluated round yet")
    return evaluated[-1]


# The headline of every table (``fedtune compare`` and ``fedtune analyze compare``): the run's
# own ``accuracy``, as its evaluator defines it for every method alike.
HEADLINE = "test accuracy"
OVERALL = "overall"
HEADLINE_NOTE = (f"{HEADLINE} = the global model's accuracy on the test set (the mean over its "
                 "domains where it has them, as the papers' Average); with model groups the "
                 "mean over the groups' global models (HeteroTune's Avg); "
                 f"{OVERALL} = accuracy over all test examples (with model groups: their mean)")


def result_columns(record: dict) -> dict[str, float]:
    """A metrics record's table columns: accuracy per domain or per client (a client's column:
    the accuracy of the global model it runs, re-weighted to its label distribution; with model
    groups a domain's is the mean over the groups), then the headline and ``overall``."""
    groups = record.get("accuracy-per-group") or {}
    if "accuracy-per-model-group" in record:  # keys "<group>/<domain or client>"
        by_column: dict[str, list[float]] = {}
        for key, acc in groups.items():
            by_column.setdefault(key.split("/", 1)[1], []).append(acc)
        groups = {k: float(np.mean(by_column[k])) for k in sorted(by_column, key=natural)}
    return groups | {HEADLINE: float(record["accuracy"]),
                     OVERALL: float(record.get("accuracy-pooled", record["accuracy"]))}


def natural(name: str) -> list:
    """Sort key: client-2 before client-10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def groups_table(runs: list[Run]) -> pd.DataFrame:
    """One row per (run, column) at the run's last evaluated round: the global model's accuracy
    per domain / per client (``result_columns``), the headline (``HEADLINE``) and ``overall``
    (accuracy over all test examples; ``accuracy`` of runs older than the ``accuracy-pooled``
    record)."""
    rows = []
    for run in runs:
        record = final_record(run)
        for group, acc in result_columns(record).items():
            rows.append(_ids(run) | {"round": record["round"], "group": group, "accuracy": acc})
    return pd.DataFrame(rows, columns=["scenario", "method", "seed", "run", "round", "group",
                                       "accuracy"])


def final_table(runs: list[Run], keys=()) -> pd.DataFrame:
    """One row per run: final headline accuracy (the mean over domains where the data has
    them), accuracy over all test examples (``pooled``), mean accuracy over groups (``avg``),
    bytes and seconds of the whole run, and the run-config ``keys`` asked for (e.g. a sweep)."""
    rounds = rounds_table(runs)
    totals = rounds.groupby("run").agg(comm_bytes=("comm_bytes", "max"),
                                       seconds=("seconds", "sum"))
    rows = []
    for run in runs:
        record = final_record(run)
        groups = list((record.get("accuracy-per-group") or {}).values())
        rows.append(_ids(run) | {k: run.config.get(k) for k in keys} | {
            "round": record["round"], "accuracy": record["accuracy"],
            "pooled": record.get("accuracy-pooled", record["accuracy"]),
            "avg": float(np.mean(groups)) if groups else float("nan"),
            "comm_bytes": int(totals.at[run.name, "comm_bytes"]),
            "seconds": float(totals.at[run.name, "seconds"])})
    return pd.DataFrame(rows)


def over_seeds(frame: pd.DataFrame, by: list[str], value: str = "accuracy") -> pd.DataFrame:
    """Mean, sample std (ddof=1; NaN for one seed) and number of seeds of ``value``."""
    out = frame.groupby(by, sort=False)[value].agg(["mean", "std", "count"])
    return out.rename(columns={"count": "seeds"}).reset_index()


# -- the paper-style table -----------------------------------------------------------------
@dataclass
class PaperTable:
    """Accuracy (%) per (scenario, method) and column (groups, headline, overall), mean over
    seeds; a scenario's table shows only the columns that have values.

    ``best`` marks, per scenario and column, the best method that is neither the proposed one
    nor a ceiling; ``delta`` is proposed minus that best (FedRA Table 1's parentheses)."""

    mean: pd.DataFrame  # index (scenario, method), columns: groups..., HEADLINE, OVERALL
    std: pd.DataFrame
    seeds: pd.DataFrame
    best: pd.DataFrame  # bool
    delta: pd.DataFrame  # NaN except on the proposed method's rows
    proposed: str | None = None
    ceilings: tuple = ()
    notes: list[str] = field(default_factory=list)

    def cells(self, mark: str = "<u>{}</u>", digits: int = 2) -> pd.DataFrame:
        """Formatted cells: ``mean ± std`` (std only with 2+ seeds), the best competitor
        wrapped in ``mark``, the proposed method's delta in parentheses."""
        out = pd.DataFrame("", index=self.mean.index, columns=self.mean.columns)
        for idx in self.mean.index:
            for col in self.mean.columns:
                m, s = self.mean.at[idx, col], self.std.at[idx, col]
                if pd.isna(m):
                    out.at[idx, col] = "-"
                    continue
                text = f"{m:.{digits}f}" + (f" ± {s:.{digits}f}" if pd.notna(s) else "")
                if self.best.at[idx, col]:
                    text = mark.format(text)
                d = self.delta.at[idx, col]
                if pd.notna(d):
                    text += f" ({d:+.{digits}f})"
                out.at[idx, col] = text
        return out

    def to_markdown(self, mark: str = "<u>{}</u>", digits: int = 2) -> str:
        cells = self.cells(mark, digits)
        scenarios = cells.index.get_level_values("scenario").unique()
        lines = []
        for scenario in scenarios:
            filled = self.mean.xs(scenario, level="scenario").notna().any()
            part = cells.xs(scenario, level="scenario").loc[:, filled]  # no column of only "-"
            if len(scenarios) > 1 or scenario != "-":
                lines += [f"**{scenario}**", ""]
            lines += markdown_table(["method"] + list(part.columns),
                                    [[m] + list(row) for m, row in part.iterrows()])
            lines.append("")
        legend = f"accuracy (%), mean over seeds ± std; {HEADLINE_NOTE}"
        if self.best.values.any():
            others = [self.proposed] if self.proposed else []
            legend += f"; {mark.format('marked')}: best method other than " + \
                      " and ".join(others + [f"the ceiling ({', '.join(self.ceilings)})"])
        if self.proposed:
            legend += f"; ({self.proposed} minus it)"
        return "\n".join(lines + [legend] + self.notes) + "\n"

    def to_csv(self, path) -> None:
        """Tidy numbers: scenario, method, column, mean, std, seeds, best, delta."""
        self.long().to_csv(path, index=False)

    def long(self) -> pd.DataFrame:
        parts = {"mean": self.mean, "std": self.std, "seeds": self.seeds, "best": self.best,
                 "delta": self.delta}
        frame = pd.concat({k: v.stack(future_stack=True) for k, v in parts.items()}, axis=1)
        frame["seeds"] = frame["seeds"].fillna(0).astype(int)
        frame.index = frame.index.set_names(["scenario", "method", "column"])
        return frame[frame["mean"].notna()].reset_index()


def ceiling_methods() -> tuple[str, ...]:
    """Methods registered as upper bounds (AllLarge): never "the best competitor" (FedRA
    Table 1)."""
    from fedtune_app.methods import METHODS

    return tuple(sorted(name for name, method in METHODS.items() if method.ceiling))


def paper_table(runs: list[Run], proposed: str | None = DEFAULT_PROPOSED,
                ceilings: tuple | None = None) -> PaperTable:
    ceilings = ceiling_methods() if ceilings is None else ceilings
    groups = groups_table(runs)
    stats = over_seeds(groups, ["scenario", "method", "group"])
    order = list(dict.fromkeys(groups["group"]))  # first run's groups first, headline last
    order = [g for g in order if g not in (HEADLINE, OVERALL)] + [HEADLINE, OVERALL]
    stats["seeds"] = stats["seeds"].astype(float)
    wide = {k: stats.pivot_table(index=["scenario", "method"], columns="group", values=k,
                                 sort=False, dropna=False).reindex(columns=order)
            for k in ("mean", "std", "seeds")}
    mean, std = wide["mean"] * 100, wide["std"] * 100
    methods = mean.index.get_level_values("method")
    base = [m.split("[")[0] for m in methods]
    is_proposed = np.array([b == proposed for b in base])
    competitor = ~is_proposed & ~np.isin(base, list(ceilings))
    best = pd.DataFrame(False, index=mean.index, columns=mean.columns)
    delta = pd.DataFrame(np.nan, index=mean.index, columns=mean.columns)
    for scenario in mean.index.get_level_values("scenario").unique():
        rows = mean.index.get_level_values("scenario") == scenario
        for col in mean.columns:
            values = mean[col].where(rows & competitor)
            if values.notna().any():
                top = values.max()
                best.loc[rows & competitor & (mean[col] == top).to_numpy(), col] = True
                delta.loc[rows & is_proposed, col] = mean[col][rows & is_proposed] - top
    notes = []
    last = groups.groupby(["scenario", "method"], sort=False)["round"].agg(["min", "max"])
    for scenario, part in last.groupby(level="scenario", sort=False):
        if part["min"].min() != part["max"].max():  # e.g. a run still going: say so
            rounds = ", ".join(f"{m} {lo}" + (f"-{hi}" if hi != lo else "")
                               for (_, m), lo, hi in zip(part.index, part["min"], part["max"]))
            where = "" if scenario == "-" else f" in {scenario}"
            notes.append(f"(not the same last evaluated round{where}: {rounds})")
    if proposed and not is_proposed.any():
        notes.append(f"(no run of the proposed method {proposed!r}: no deltas)")
    return PaperTable(mean, std, wide["seeds"], best, delta,
                      proposed if is_proposed.any() else None, tuple(ceilings), notes)


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """GitHub-flavoured Markdown lines (no extra dependency); numbers right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return [line(header), rule] + [line(r) for r in rows]


# -- allocation and layer coverage ---------------------------------------------------------
def allocation_counts(run: Run) -> pd.DataFrame:
    """How many rounds each client (partition id, rows) held each block (columns)."""
    num_blocks = len(run.allocation[0]["matrix"][0]) if run.allocation else 0
    pids = sorted({p for r in run.allocation for p in r["clients"]} |
                  {c["partition_id"] for c in run.clients})
    counts = pd.DataFrame(0, index=pd.Index(pids, name="client"),
                          columns=pd.Index(range(num_blocks), name="block"))
    for r in run.allocation:
        counts.loc[r["clients"]] += np.asarray(r["matrix"], dtype=int)
    return counts


def coverage_table(runs: list[Run]) -> pd.DataFrame:
    """Gamma_t^l of FedRA's Theorem 1: the number of clients that trained block l in round t
    (one row per run, round, block)."""
    rows = []
    for run in runs:
        for r in run.allocation:
            for block, gamma in enumerate(np.asarray(r["matrix"], dtype=int).sum(axis=0)):
                rows.append(_ids(run) | {"round": r["round"], "block": block, "gamma": int(gamma)})
    return pd.DataFrame(rows, columns=["scenario", "method", "seed", "run", "round", "block",
                                       "gamma"])


def gamma_star(coverage: pd.DataFrame) -> pd.Series:
    """Gamma* = min over rounds t and blocks l trained in round t of Gamma_t^l, per run (the
    theorem's bound shrinks as Gamma* grows)."""
    trained = coverage[coverage["gamma"] > 0]
    return trained.groupby("run")["gamma"].min()


# -- plots ---------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not hasattr(sys, "ps1") and \
            "ipykernel" not in sys.modules:
        matplotlib.use("Agg")  # headless (CLI, tests); notebooks keep their inline backend
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, path):
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def _legend(ax):
    """Outside the axes, right: never hides data, however many methods."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)


def _curve_label(scenario: str, method: str, many_scenarios: bool) -> str:
    return f"{method} ({scenario})" if many_scenarios else method


def _curves(rounds: pd.DataFrame, x: str):
    """(label, x, mean accuracy %, std %) per (scenario, method), over seeds."""
    evaluated = rounds.dropna(subset=["accuracy"])
    many = evaluated["scenario"].nunique() > 1
    for (scenario, method), part in evaluated.groupby(["scenario", "method"], sort=False):
        stats = part.groupby("round").agg(x=(x, "mean"), mean=("accuracy", "mean"),
                                          std=("accuracy", "std"))
        yield (_curve_label(scenario, method, many), stats["x"].to_numpy(),
               stats["mean"].to_numpy() * 100, stats["std"].fillna(0).to_numpy() * 100)


def plot_accuracy(rounds: pd.DataFrame, path=None, x: str = "round"):
    """Global test accuracy per round (or vs ``comm_bytes``), mean over seeds, band = ± std."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for label, xs, mean, std in _curves(rounds, x):
        xs = xs / 1e6 if x == "comm_bytes" else xs
        ax.plot(xs, mean, marker="o", ms=3, label=label)
        ax.fill_between(xs, mean - std, mean + std, alpha=0.15)
    if x == "comm_bytes":
        ax.set_xlabel("communicated (MB, down + up, cumulative)")
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
    ax.set_ylabel("global test accuracy (%)")
    ax.set_title("accuracy vs communication" if x == "comm_bytes" else "accuracy per round")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _finish(fig, path)


def plot_accuracy_vs_bytes(rounds: pd.DataFrame, path=None):
    return plot_accuracy(rounds, path, x="comm_bytes")


def plot_sweep(final: pd.DataFrame, key: str, path=None, value: str = "accuracy"):
    """Final accuracy against one run-config ``key`` (a ``final_table(runs, keys=[key])``
    column), one line per method, mean over seeds, whiskers = std."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    numeric = pd.to_numeric(final[key], errors="coerce").notna().all()
    order = sorted(final[key].unique(), key=float if numeric else str)
    for i, (method, part) in enumerate(final.groupby("method", sort=False)):
        stats = part.groupby(key)[value].agg(["mean", "std"]).reindex(order).dropna(how="all")
        xs = stats.index.astype(float) if numeric else [order.index(v) for v in stats.index]
        ax.errorbar(xs, stats["mean"] * 100, yerr=stats["std"].fillna(0) * 100, capsize=3,
                    marker="osD^v<>"[i % 7], ms=8 - i % 4, label=method)  # ties stay visible
    if numeric and min(map(float, order)) > 0 and max(map(float, order)) / \
            min(map(float, order)) >= 100:
        ax.set_xscale("log")  # e.g. Dirichlet alpha 0.1 .. 100
    if not numeric:
        ax.set_xticks(range(len(order)), order)
    ax.set_xlabel(key)
    ax.set_ylabel("final global test accuracy (%)" if value == "accuracy"
                  else f"final {value} accuracy (%)")
    ax.set_title(f"accuracy vs {key}")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _finish(fig, path)


def plot_group_accuracy(groups: pd.DataFrame, path=None):
    """Final accuracy per group (domain / client), one bar per method, error bar = std."""
    plt = _pyplot()
    stats = over_seeds(groups, ["scenario", "method", "group"])
    many = stats["scenario"].nunique() > 1
    stats["label"] = [_curve_label(s, m, many) for s, m in zip(stats["scenario"], stats["method"])]
    labels = list(dict.fromkeys(stats["label"]))
    cols = list(dict.fromkeys(stats["group"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cols) * max(1, len(labels)) / 2 + 2), 3.8))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        part = stats[stats["label"] == label].set_index("group").reindex(cols)
        spread = part["std"] * 100 if part["std"].notna().any() else None  # one seed: none
        ax.bar(np.arange(len(cols)) + (i - (len(labels) - 1) / 2) * width, part["mean"] * 100,
               width, yerr=spread, label=label, capsize=2)
    ax.set_xticks(np.arange(len(cols)), cols, rotation=30 if len(cols) > 6 else 0)
    ax.set_ylabel("global test accuracy (%)")
    ax.set_title(f"final accuracy per group, {HEADLINE} and {OVERALL}")
    ax.grid(axis="y", alpha=0.3)
    _legend(ax)
    return _finish(fig, path)


def plot_allocation(run: Run, path=None):
    """Heat map: in how many rounds each client trained each block (FedRA's matrix M summed)."""
    plt = _pyplot()
    counts = allocation_counts(run)
    capacity = {c["partition_id"]: c["capacity"] for c in run.clients}
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * counts.shape[1] + 2.5),
                                    max(2.5, 0.4 * counts.shape[0] + 1.5)))
    image = ax.imshow(counts.to_numpy(), cmap="viridis", vmin=0, vmax=len(run.allocation),
                      aspect="auto")
    for (i, j), v in np.ndenumerate(counts.to_numpy()):
        ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                color="white" if v < len(run.allocation) / 2 else "black")
    ax.set_xticks(range(counts.shape[1]), counts.columns)
    ax.set_yticks(range(counts.shape[0]),
                  [f"client {p} (L={capacity.get(p, '?')})" for p in counts.index])
    ax.set_xlabel("block (global index)")
    ax.set_title(f"{run.method}: rounds each client trained each block "
                 f"({len(run.allocation)} rounds)", fontsize=9)
    fig.colorbar(image, ax=ax, label="rounds").ax.yaxis.get_major_locator().set_params(
        integer=True)
    return _finish(fig, path)


def plot_label_counts(runs: list[Run], path=None):
    """What each scenario's split looks like: training examples per class (stacked) of every
    client, one panel per scenario (first run of each)."""
    plt = _pyplot()
    first = list({r.scenario: r for r in reversed(runs)}.values())[::-1]
    fig, axes = plt.subplots(1, len(first), figsize=(3.2 * len(first) + 1.5, 3.4),
                             squeeze=False, sharey=True)
    cmap = plt.get_cmap("tab10")
    for ax, run in zip(axes[0], first):
        counts = np.array([c["label_counts"] for c in run.clients])
        bottom = np.zeros(len(counts))
        names = run.class_names or tuple(map(str, range(counts.shape[1])))
        for c in range(counts.shape[1]):
            ax.bar(range(len(counts)), counts[:, c], bottom=bottom, color=cmap(c % 10),
                   label=names[c])
            bottom += counts[:, c]
        ax.set_xticks(range(len(counts)), [str(c["partition_id"]) for c in run.clients])
        ax.set_xlabel("client")
        ax.set_title(run.scenario, fontsize=9)
    axes[0][0].set_ylabel("training examples")
    _legend(axes[0][-1])
    axes[0][-1].get_legend().set_title("class")
    return _finish(fig, path)


def plot_coverage(coverage: pd.DataFrame, path=None):
    """Gamma_t^l per block: mean over rounds (and seeds), error bar = min..max; the legend
    gives each method's Gamma* (FedRA Theorem 1)."""
    plt = _pyplot()
    star = gamma_star(coverage)
    many = coverage["scenario"].nunique() > 1
    keys = list(dict.fromkeys(zip(coverage["scenario"], coverage["method"])))
    blocks = sorted(coverage["block"].unique())
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(blocks) * max(1, len(keys)) / 2 + 2), 3.8))
    width = 0.8 / max(len(keys), 1)
    for i, (scenario, method) in enumerate(keys):
        part = coverage[(coverage["scenario"] == scenario) & (coverage["method"] == method)]
        g = part.groupby("block")["gamma"].agg(["mean", "min", "max"]).reindex(blocks)
        runs_star = int(star.reindex(part["run"].unique()).min())
        ax.bar(np.arange(len(blocks)) + (i - (len(keys) - 1) / 2) * width, g["mean"], width,
               yerr=[g["mean"] - g["min"], g["max"] - g["mean"]], capsize=2,
               label=f"{_curve_label(scenario, method, many)} (Γ*={runs_star})")
    ax.set_xticks(np.arange(len(blocks)), blocks)
    ax.set_xlabel("block (global index)")
    ax.set_ylabel("clients training the block (Γ)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("per-round layer coverage Γ_t^l (bar: mean, whiskers: min..max)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    _legend(ax)
    return _finish(fig, path)


def global_features(run: Run, num_examples: int = 300, seed: int = 0):
    """(pre-logit features, labels, class names) of the run's final global model on a
    stratified subset of the test set. The model is rebuilt from the run config and its
    ``state.safetensors``; it runs the blocks the method evaluates with (its ``eval_plan``)."""
    import torch
    from safetensors.numpy import load_file

    from fedtune_app.data.splits import run_num_classes, run_splits, stratified_split
    from fedtune_app.federated.strategy import ClientInfo
    from fedtune_app.methods import METHODS, resolve_config
    from fedtune_app.model.adapters import AdapterSpec, attach_adapters, load_state
    from fedtune_app.model.backbones import ModelSpec, build_backbone
    from fedtune_app.training.local import to_device

    state_file = run.folder / "state.safetensors"
    if not state_file.is_file():
        raise FileNotFoundError(f"{state_file}: the run has not finished (no final state)")
    cfg = resolve_config({k: v for k, v in run.config.items() if k != "preset"})
    model = attach_adapters(build_backbone(ModelSpec.from_config(cfg.model, run_num_classes(cfg))),
                            AdapterSpec.from_config(cfg.adapter))
    state = load_file(str(state_file))
    load_state(model, state)
    clients = [ClientInfo(**(c | {"label_counts": tuple(c["label_counts"])}))
               for c in run.clients]
    plan = METHODS[cfg.method].strategy(cfg, clients, model.num_blocks, state).eval_plan()
    splits = run_splits(cfg)
    test = splits.test
    if num_examples < len(test):
        _, keep = stratified_split(test.labels.numpy(), num_examples / len(test), seed)
        test = test.subset(keep)
    feats = []
    with torch.inference_mode():
        for inputs, _ in test.batches(cfg.federation.eval_batch_size):
            feats.append(model.features(to_device(inputs, torch.device("cpu")), plan))
    return torch.cat(feats).numpy(), test.labels.numpy(), splits.class_names


def plot_tsne(run: Run, path=None, num_examples: int = 300, seed: int = 0):
    """t-SNE (2-D) of the global model's features on test examples, coloured by class
    (FedRA Fig. 5): well-separated clusters = features the head can separate."""
    from sklearn.manifold import TSNE

    plt = _pyplot()
    feats, labels, names = global_features(run, num_examples, seed)
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    perplexity = min(30.0, (len(feats) - 1) / 3)
    with threadpool_limits(1):  # OpenMP threads on a busy machine: 10x slower, not faster
        xy = TSNE(n_components=2, perplexity=perplexity, init="pca",
                  random_state=seed).fit_transform(feats)
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    for c, name in enumerate(names):
        pts = xy[labels == c]
        ax.scatter(pts[:, 0], pts[:, 1], s=9, color=cmap(c % cmap.N), label=name)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("t-SNE 1")
    ax.set_ylabel("t-SNE 2")
    ax.set_title(f"{run.method}: t-SNE of global features, {len(feats)} test examples",
                 fontsize=9)
    ax.legend(fontsize=7, markerscale=1.5, loc="center left", bbox_to_anchor=(1, 0.5),
              title="class")
    return _finish(fig, path)


def save_plots(runs: list[Run], folder, tsne: bool = False) -> list[Path]:
    """Every comparison plot as PNG into ``folder``; returns the files."""
    plt = _pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rounds, groups, coverage = rounds_table(runs), groups_table(runs), coverage_table(runs)
    figures = {"accuracy-per-round.png": lambda p: plot_accuracy(rounds, p),
               "accuracy-vs-bytes.png": lambda p: plot_accuracy_vs_bytes(rounds, p),
               "accuracy-per-group.png": lambda p: plot_group_accuracy(groups, p)}
    if not coverage.empty:
        figures["layer-coverage.png"] = lambda p: plot_coverage(coverage, p)
    first = {}  # one run per (scenario, method): the lowest seed
    for run in sorted(runs, key=lambda r: r.seed):
        first.setdefault((run.scenario, run.method), run)
    for i, run in enumerate(first.values()):
        tag = f"{run.method}-{i}" if len(first) > len({r.method for r in first.values()}) \
            else run.method
        tag = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in tag)
        if run.allocation:
            figures[f"allocation-{tag}.png"] = lambda p, r=run: plot_allocation(r, p)
        if tsne:
            figures[f"tsne-{tag}.png"] = lambda p, r=run: plot_tsne(r, p)
    written = []
    for name, draw in figures.items():
        plt.close(draw(folder / name))
        written.append(folder / name)
    return written


# -- command line --------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fedtune analyze",
                                     description="Compare fedtune results folders.")
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser("compare", help="print the paper-style table of results folders")
    compare.add_argument("paths", nargs="+", help="results folders, or folders holding them")
    compare.add_argument("--proposed", default=DEFAULT_PROPOSED,
                         help=f"method whose deltas are shown (default {DEFAULT_PROPOSED}; '' "
                              "for none)")
    compare.add_argument("--method-keys", default="",
                         help="comma-separated run-config keys that name a method variant")
    compare.add_argument("--csv", help="also write the table's numbers (tidy) to this CSV")
    compare.add_argument("--markdown", help="also write the Markdown table to this file")
    compare.add_argument("--rounds-csv", help="also write the per-round table to this CSV")
    compare.add_argument("--plots", help="write the comparison plots (PNG) into this folder")
    compare.add_argument("--tsne", action="store_true",
                         help="with --plots: also a t-SNE per method (rebuilds each model)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(*args.paths, method_keys=[k for k in args.method_keys.split(",") if k])
        table = paper_table(runs, proposed=args.proposed or None)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(f"{len(runs)} runs: " + ", ".join(sorted({r.method for r in runs})))
    print(table.to_markdown(mark="_{}_"))
    for out in (args.markdown, args.csv, args.rounds_csv):
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
    if args.markdown:
        Path(args.markdown).write_text(table.to_markdown())
    if args.csv:
        table.to_csv(args.csv)
    if args.rounds_csv:
        rounds_table(runs).to_csv(args.rounds_csv, index=False)
    if args.plots:
        for path in save_plots(runs, args.plots, tsne=args.tsne):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
