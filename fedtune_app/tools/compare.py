"""Compare methods on the same split, capacities and seed: one table (Markdown + CSV), one plot.

    python -m fedtune_app.tools.compare --methods all-large,all-small,inclusivefl,depthfl,fedra \\
        --run-config "num-server-rounds=5" --out results/compare

``--run-config`` takes what ``flwr run . --run-config`` takes (``"key=value ..."`` or a TOML
file); every method gets exactly these keys plus its own ``method``, so the split (fixed split
seed + ``seed``), the capacities and the seed are the same for all. Each method runs in this
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

from flwr.common.config import parse_config_args

from fedtune_app.config import ConfigError, setup_logging
from fedtune_app.methods import METHODS, resolve_config
from fedtune_app.apps.inprocess import run_inprocess

def run_method(method: str, run_config: dict, runs_dir: Path) -> Path:
    return Path(run_inprocess(dict(run_config) | {"method": method,
                                                  "results-dir": str(runs_dir)}))


def summarize(method: str, folder: Path) -> dict:
    """The last evaluated round of a run: overall accuracy, per-group accuracy, their mean."""
    metrics = [m for m in json.loads((folder / "metrics.json").read_text())
               if m["accuracy"] is not None]
    last = metrics[-1]
    groups = last["accuracy-per-group"]
    average = sum(groups.values()) / len(groups)
    if "accuracy-per-model-group" in last:  # model groups: HeteroTune's Smallest/Largest/Avg
        groups = {k: last[f"accuracy-{k}"] for k in ("smallest", "largest")}
        average = last["accuracy"]
    extras = {k: v for k, v in last.items() if k.startswith("accuracy-")
              and isinstance(v, (int, float))
              and k not in ("accuracy-smallest", "accuracy-largest")}
    return {"method": method, "round": last["round"], "groups": groups,
            "average": average, "accuracy": last["accuracy"],
            "extras": extras, "curve": [(m["round"], m["accuracy"]) for m in metrics],
            "folder": str(folder)}


def group_labels(folder: Path) -> dict[str, str]:
    config = json.loads((folder / "config.json").read_text())
    if config["run-config"].get("model-groups"):
        return {"smallest": "smallest model", "largest": "largest model"}
    return {c["group"]: f"{c['group']} (L={c['capacity']})" for c in config["clients"]}


def write_table(rows: list[dict], labels: dict[str, str], out: Path, command: str) -> None:
    groups = list(labels)
    header = ["method"] + [labels[g] for g in groups] + ["average", "overall"]
    table = [[r["method"]] + [f"{100 * r['groups'][g]:.2f}" for g in groups]
             + [f"{100 * r['average']:.2f}", f"{100 * r['accuracy']:.2f}"] for r in rows]
    with (out / "compare.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header + ["round", "extras"])
        for r, line in zip(rows, table):
            writer.writerow(line + [r["round"], json.dumps(r["extras"])])
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(line) + " |" for line in table]
    note = ("smallest / largest model = test accuracy of the smallest / largest model group's "
            "global model; average = mean over the model groups (= overall)"
            if "smallest" in labels else "a group's column is the test accuracy re-weighted to "
            "that client's label distribution; average = mean over groups; overall = plain test "
            "accuracy")
    md += ["", f"Test accuracy (%) of the global model after the last round; {note}.", ""]
    md += [f"- {r['method']}: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in r["extras"].items())
           for r in rows if r["extras"]]
    md += ["", f"Command: `{command}`"]
    (out / "compare.md").write_text("\n".join(md) + "\n")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5), dpi=120)
    for r in rows:
        ax.plot(*zip(*r["curve"]), marker="o", label=r["method"])
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("global test accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compare(methods: list[str], run_config: dict, out: Path, command: str = "") -> list[dict]:
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"--methods: {m!r} is not an available method; allowed: "
                              f"{', '.join(METHODS)}")
    for method in methods:  # bad keys (or a method the keys do not fit) stop here, before any run
        resolve_config(dict(run_config) | {"method": method})
    out.mkdir(parents=True, exist_ok=True)
    rows, labels = [], {}
    for method in methods:
        folder = run_method(method, run_config, out / "runs")
        rows.append(summarize(method, folder))
        labels = labels or group_labels(folder)
        write_table(rows, labels, out, command)  # after each method: a stopped run keeps its rows
        plot(rows, out / "compare.png")
    return rows


def shell_quote(text: str) -> str:
    """As a user would type it: in double quotes unless that needs escapes."""
    return f'"{text}"' if not set('"$`\\') & set(text) else shlex.quote(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="all-large,all-small,inclusivefl,depthfl,fedra")
    parser.add_argument("--run-config", default="", help="'key=value ...' or a TOML file")
    parser.add_argument("--out", default=f"results/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    setup_logging()
    run_config = parse_config_args([args.run_config] if args.run_config else None)
    command = f"python -m fedtune_app.tools.compare --methods {args.methods}" + (
        f" --run-config {shell_quote(args.run_config)}" if args.run_config else "")
    out = Path(args.out).resolve()
    compare([m.strip() for m in args.methods.split(",") if m.strip()], run_config, out, command)
    print((out / "compare.md").read_text())
    print(f"COMPARISON {out}", flush=True)


if __name__ == "__main__":
    main()
