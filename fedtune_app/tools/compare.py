"""Compare methods on the same split, capacities and seed: one table (Markdown + CSV), one plot.

    python -m fedtune_app.tools.compare --methods all-large,all-small,inclusivefl,depthfl,fedra \\
        --run-config "num-server-rounds=5" --seeds 0,1,2 --out results/compare

``--run-config`` takes what ``flwr run . --run-config`` takes (``"key=value ..."`` or a TOML
file); every method gets exactly these keys plus its own ``method``, so the split (fixed split
seed + ``seed``), the capacities and the seed are the same for all. With key ``fleet`` (the
clients' capacities) depth, rank and model-group methods share one comparison: each derives
its own blocks, ranks or model groups from the same devices (``fedtune_app.data.fleet``), and
compare.md lists what each got. The table's headline column is ``analysis.HEADLINE``, the same
number ``fedtune analyze compare`` shows. ``--seeds`` runs every method
once per seed (the key ``seed``: allocation, sampling, partitions, initial adapters); the table
then shows mean ± sample std over the seeds, the CSV one row per run. Each method runs in this
process: the real ServerApp logic (``run_federation``) and the real ClientApp, over an
in-process Grid (every payload still goes through Flower Messages and ArrayRecords). That skips
Ray's start-up (~25 s per ``flwr run``) and needs no SuperLink, and one process keeps the
pretrained backbone loaded across methods. Writes ``compare.md``, ``compare.csv``,
``compare.png`` and one results folder per method (``runs/``) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import time
from pathlib import Path

import numpy as np

from fedtune_app.apps.inprocess import progress, run_inprocess
from fedtune_app.config import ConfigError, naming_given_keys, parse_int_list, setup_logging
from fedtune_app.data.fleet import describe, parse_fleet
from fedtune_app.federated.flower_private import parse_config_args
from fedtune_app.methods import METHODS, resolve_config
from fedtune_app.tools.analysis import (
    HEADLINE,
    HEADLINE_NOTE,
    OVERALL,
    last_evaluated,
    result_columns,
)
from fedtune_app.tools.preflight import check_data, check_fleet, check_machine


def run_config_of(method: str, run_config: dict) -> dict:
    """One method's run config: the given keys and the method, each winning over a preset."""
    return naming_given_keys(dict(run_config) | {"method": method})


def run_method(method: str, run_config: dict, runs_dir: Path) -> Path:
    return Path(run_inprocess(run_config_of(method, run_config) | {"results-dir": str(runs_dir)}))


def summarize(method: str, folder: Path) -> dict:
    """The last evaluated round of a run: its table columns (``analysis.result_columns``: per
    domain or client, the headline, overall), the other accuracies it reports and its curve."""
    metrics = json.loads((folder / "metrics.json").read_text())
    last = last_evaluated(metrics, folder)
    extras = {k: v for k, v in last.items() if k.startswith("accuracy-")
              and isinstance(v, (int, float)) and k != "accuracy-pooled"}  # pooled: a column
    seed = json.loads((folder / "config.json").read_text())["run-config"]["seed"]
    return {"method": method, "seed": seed, "round": last["round"],
            "columns": result_columns(last), "extras": extras,
            "curve": [(m["round"], m["accuracy"]) for m in metrics if m["accuracy"] is not None],
            "folder": str(folder)}


def group_labels(folder: Path) -> dict[str, str]:
    """Column -> its header: a client's or domain's with its capacity (over a fleet: the
    fleet's entry, which every method of the comparison shares)."""
    config = json.loads((folder / "config.json").read_text())
    fleet = config["run-config"].get("fleet", "")
    if fleet:
        entries = parse_fleet(fleet)[0]
        return {c["group"]: f"{c['group']} (capacity {entries[c['partition_id']]})"
                for c in config["clients"]}
    return {c["group"]: f"{c['group']} (L={c['capacity']})" for c in config["clients"]}


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1, as fedtune_app.tools.analysis; NaN for one value)."""
    mean = float(np.mean(values))
    return mean, float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def _cell(values: list[float | None]) -> str:
    if any(v is None for v in values):  # a column this method's runs do not have
        return "-"
    mean, std = _mean_std([100 * v for v in values])
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {std:.2f}"


def by_method(rows: list[dict]) -> dict[str, list[dict]]:
    """The runs of each method (one per seed), methods in the order they ran."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["method"], []).append(r)
    return out


def write_table(rows: list[dict], labels: dict[str, str], out: Path, command: str,
                settings: dict[str, str] | None = None) -> None:
    """compare.csv (one row per run), compare.md (one row per method); ``settings``: what each
    method made of the fleet."""
    columns = [c for c in dict.fromkeys(c for r in rows for c in r["columns"])
               if c not in (HEADLINE, OVERALL)] + [HEADLINE, OVERALL]
    header = ["method"] + [labels.get(c, c) for c in columns]
    with (out / "compare.csv").open("w", newline="") as f:  # one row per run
        writer = csv.writer(f)
        writer.writerow(header + ["round", "seed", "extras"])
        for r in rows:
            writer.writerow([r["method"]] + [f"{100 * r['columns'][c]:.2f}"
                                             if c in r["columns"] else "" for c in columns]
                            + [r["round"], r["seed"], json.dumps(r["extras"])])
    runs = by_method(rows)
    table = [[method] + [_cell([r["columns"].get(c) for r in rs]) for c in columns]
             for method, rs in runs.items()]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(line) + " |" for line in table]
    note = ("a domain's column is the accuracy on that domain's test examples, a client's column "
            "the test accuracy of the global model it runs, re-weighted to its label "
            f"distribution; {HEADLINE_NOTE}")
    seeds = sorted({r["seed"] for r in rows})
    over = (f"mean ± sample std over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1
            else f"seed {seeds[0]}")
    md += ["", f"Test accuracy (%) of the global model after the last round ({over}); {note}.", ""]
    if settings:
        md += ["Each method's setting of the fleet (clients in order):", ""]
        md += [f"- {method}: {setting}" for method, setting in settings.items()] + [""]
    extras = [f"- {method}: " + ", ".join(f"{k} {_cell([r['extras'][k] for r in rs])}"
                                         for k in rs[0]["extras"])
              for method, rs in runs.items() if rs[0]["extras"]]
    md += ["Other accuracies the runs report:", ""] + extras if extras else []
    md += ["", f"Command: `{command}`"]
    (out / "compare.md").write_text("\n".join(md) + "\n")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5), dpi=120)
    for method, rs in by_method(rows).items():  # mean curve over seeds, std band with 2+
        rounds = [x for x, _ in rs[0]["curve"]]
        values = np.array([[y for _, y in r["curve"]] for r in rs])
        line, = ax.plot(rounds, values.mean(0), marker="o", label=method)
        if len(rs) > 1:
            std = values.std(0, ddof=1)
            ax.fill_between(rounds, values.mean(0) - std, values.mean(0) + std, alpha=0.2,
                            color=line.get_color())
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("global test accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compare(methods: list[str], run_config: dict, out: Path, command: str = "",
            seeds: list[int] | None = None) -> list[dict]:
    """Run every method once per seed (None: the run config's own seed); one row per run."""
    if not methods:
        raise ConfigError(f"--methods: no method given; allowed: {', '.join(METHODS)}")
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"--methods: {m!r} is not an available method; allowed: "
                              f"{', '.join(METHODS)}")
    settings = {}
    for method in methods:  # bad keys (or a method the keys do not fit) stop here, before any run
        cfg = resolve_config(run_config_of(method, run_config))
        check_fleet(cfg)  # each method reads the clients' capacities its own way
        if cfg.federation.fleet.strip():
            settings[method] = describe(cfg)
    check_machine(cfg)  # the machine and the data are every method's: checked once
    check_data(cfg)
    if seeds is not None and (not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0):
        raise ConfigError(f"--seeds {seeds}: expected distinct non-negative integers, e.g. 0,1,2")
    configs = [dict(run_config)] if seeds is None else \
        [dict(run_config) | {"seed": seed} for seed in seeds]
    out.mkdir(parents=True, exist_ok=True)
    rows, labels = [], {}
    with progress([config | {"method": m} for m in methods for config in configs], "compare"):
        for method in methods:
            for config in configs:
                folder = run_method(method, config, out / "runs")
                rows.append(summarize(method, folder))
                labels = group_labels(folder) | labels
                # after each run: a stopped comparison keeps its rows
                write_table(rows, labels, out, command, settings)
                plot(rows, out / "compare.png")
    return rows


def shell_quote(text: str) -> str:
    """As a user would type it: in double quotes unless that needs escapes."""
    return f'"{text}"' if not set('"$`\\') & set(text) else shlex.quote(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="all-large,all-small,inclusivefl,depthfl,fedra")
    parser.add_argument("--run-config", default="", help="'key=value ...' or a TOML file")
    parser.add_argument("--seeds", default="", help="run every method once per seed, e.g. "
                        "'0,1,2' (table: mean ± std); default: the run config's seed")
    parser.add_argument("--out", default=f"results/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    setup_logging()
    run_config = parse_config_args([args.run_config] if args.run_config else None)
    command = f"fedtune compare --methods {args.methods}" + (
        f" --run-config {shell_quote(args.run_config)}" if args.run_config else "") + (
        f" --seeds {args.seeds}" if args.seeds else "")
    seeds = parse_int_list("--seeds", args.seeds) if args.seeds else None
    out = Path(args.out).resolve()
    compare([m.strip() for m in args.methods.split(",") if m.strip()], run_config, out, command,
            seeds)
    print((out / "compare.md").read_text())
    print(f"COMPARISON {out}", flush=True)


if __name__ == "__main__":
    main()
