"""A deployed round against the same round simulated: the same job (same run-config keys) run
on local SuperNodes (one process each, a fresh ClientApp process per message, as
docs/deployment.md's local variant) and with `flwr run`'s simulation (Ray, one CPU per client),
then each round's seconds (``metrics.json``) compared.

    .venv/bin/python benchmarks/bench_deployment.py \
        [--run-config 'num-server-rounds=2 train-subset=240 test-subset=100'] [--only deployed]

``--workers yes`` starts one ``fedtune node-worker`` beside each SuperNode (node config
``worker-address``/``worker-authkey-file``): messages are then served by a warm process;
``--workers both`` runs the deployment cold and warm. Flower's SuperExec task poll interval is
``--poll-interval`` (else ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` of the environment; Flower's
default 1 s).

Target: a deployed round at most 1.5x the simulated round. Both runs write their results under
``--workdir``; the SuperLink, SuperNodes and the simulation's local SuperLink are stopped after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.localdeploy import LocalDeployment  # noqa: E402

POLL_INTERVAL = ""


def round_seconds(folder: Path) -> list[float]:
    return [float(row["seconds"]) for row in json.loads((folder / "metrics.json").read_text())]


def results_folder(output: str) -> Path:
    lines = [line for line in output.splitlines() if line.startswith("RESULTS ")]
    if not lines:
        raise RuntimeError(f"no RESULTS line in the run's output:\n{output[-3000:]}")
    return Path(lines[-1].split(" ", 1)[1].strip())


def deployed(run_config: str, workdir: Path, nodes: int, timeout: float,
             workers: bool = False) -> list[float]:
    # one machine: the nodes share one node-local folder (layered checkpoint, data cache)
    configs = [f"partition-id={i} num-partitions={nodes} data-dir=\"{workdir}/node-data\""
               for i in range(nodes)]
    label = "deployed-warm" if workers else "deployed"
    results = workdir / label
    deploy = workdir / label.replace("deployed", "deploy")
    deploy.mkdir(parents=True, exist_ok=True)
    key = deploy / "worker.key"
    if workers:  # one long-lived node worker per SuperNode, as `fedtune node-worker` beside it
        configs = [f'{c} worker-address="{deploy}/worker-{i}.sock" worker-authkey-file="{key}"'
                   for i, c in enumerate(configs)]
    deployment = LocalDeployment(deploy, configs, name="bench")
    deployment.env["PYTHONPATH"] = str(ROOT)
    if POLL_INTERVAL:  # Flower's SuperExec task poll (default 1 s), SuperLink and SuperNodes
        deployment.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = POLL_INTERVAL
    if workers:
        for i in range(nodes):
            deployment._spawn(f"worker-{i}", [
                "python", "-m", "fedtune_app.tools.cli", "node-worker", "--address",
                f"{deploy}/worker-{i}.sock", "--authkey-file", str(key)])
    with deployment:
        started = time.perf_counter()
        done = deployment.run(f'{run_config} min-nodes={nodes} results-dir="{results}"',
                              timeout=timeout)
        print(f"deployed run: {time.perf_counter() - started:.1f} s wall", flush=True)
        if done.returncode:
            raise RuntimeError(f"flwr run failed:\n{done.stdout}{done.stderr}\n"
                               f"{deployment.logs()}")
    return round_seconds(results_folder(done.stdout))


def simulated(run_config: str, workdir: Path, timeout: float, app: Path) -> list[float]:
    results = workdir / "simulated"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedtune_app.tools.cli", "run", "--results",
                           str(results), "--run-config", run_config], cwd=app,
                          capture_output=True, text=True, timeout=timeout)
    print(f"simulated run: {time.perf_counter() - started:.1f} s wall", flush=True)
    if done.returncode:
        raise RuntimeError(f"fedtune run failed:\n{done.stdout[-5000:]}{done.stderr[-3000:]}")
    return round_seconds(Path(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-config", default="num-server-rounds=2 train-subset=240 "
                                                "test-subset=100")
    parser.add_argument("--nodes", type=int, default=6, help="the default job's six clients")
    parser.add_argument("--workdir", default="bench-deployment")
    parser.add_argument("--only", choices=("deployed", "simulated"))
    parser.add_argument("--workers", choices=("no", "yes", "both"), default="no",
                        help="deployed with a warm node worker per SuperNode (yes), without "
                             "(no: a fresh ClientApp process per message), or both")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--app", default=str(ROOT), help="the checkout the simulation runs")
    parser.add_argument("--poll-interval", default="",
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the deployed processes, "
                             "seconds (Flower's default: 1)")
    args = parser.parse_args()
    global POLL_INTERVAL
    POLL_INTERVAL = args.poll_interval or os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "")
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    rows = {}
    if args.only != "simulated":
        if args.workers in ("no", "both"):
            rows["deployed"] = deployed(args.run_config, workdir, args.nodes, args.timeout)
        if args.workers in ("yes", "both"):
            rows["deployed-warm"] = deployed(args.run_config, workdir, args.nodes, args.timeout,
                                             workers=True)
    if args.only != "deployed":
        rows["simulated"] = simulated(args.run_config, workdir, args.timeout,
                                      Path(args.app).resolve())
    for name, seconds in rows.items():
        print(f"{name:>10}: round seconds {', '.join(f'{s:.1f}' for s in seconds)}")
    for name in ("deployed", "deployed-warm"):
        if name in rows and "simulated" in rows:
            ratios = [d / s for d, s in zip(rows[name], rows["simulated"])]
            print(f"{name} / simulated per round: {', '.join(f'{r:.2f}' for r in ratios)} "
                  "(target <= 1.5)")
    out = workdir / f"bench_deployment{'-poll-' + POLL_INTERVAL if POLL_INTERVAL else ''}.json"
    out.write_text(json.dumps({"run-config": args.run_config, "rounds": rows,
                               "poll-interval": POLL_INTERVAL or "1 (default)",
                               "load": os.getloadavg()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
