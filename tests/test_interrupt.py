"""Ctrl-C stops everything `fedtune run` started: SIGINT to its process group (what a terminal
sends) mid-run leaves no Flower or Ray process of it, says where the results and the last
checkpoint are, and the printed command's keys resume the run. The real `flwr run`, local
SuperLink and Ray simulation. (SIGTERM takes the same path in `fedtune run`.) The run uses the
batched client engine, whose bundles this checks through Ray too (tests/test_batched_engine.py
checks in process that a bundled round equals the sequential one)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.config import app_defaults
from fedtune_app.federated.flower_private import parse_config_args
from fedtune_app.tools.cli import checkpoint_round
from fedtune_app.tools.local_superlink import stop

# a `flwr run` through Ray: `make test` runs these one at a time (scripts/test.sh)
pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ROUNDS = 500  # ~0.2 s each: far from done when the signal comes


def ours(home: Path) -> list[psutil.Process]:
    """Every process whose environment names this test's FLWR_HOME: `fedtune run`, `flwr run`,
    the SuperLink, SuperExec, flwr-simulation, Ray's daemons and workers."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FLWR_HOME") == str(home):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def names(procs) -> str:
    out = []
    for p in procs:
        try:
            out.append(" ".join(Path(a).name for a in p.cmdline()[:3]))
        except psutil.Error:
            pass
    return " | ".join(out)


@pytest.mark.integration
def test_sigint_stops_the_run_and_everything_it_started_and_the_run_resumes(tmp_path):
    home, results, out = tmp_path / "flwr-home", tmp_path / "results", tmp_path / "out.log"
    env = {**os.environ, "FLWR_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    # the batched client engine (one Ray run for both: Ray's start-up is most of its cost)
    keys = f'preset="smoke" num-server-rounds={ROUNDS} client-engine="batched"'
    # the smoke preset's 3 clients; the batched engine sends a round's cohort to one node, so
    # one Ray actor is all it needs (Ray given 1 CPU, each actor 1: whatever the machine)
    federation = "num-supernodes=3 client-resources-num-cpus=1 init-args-num-cpus=1"
    with out.open("w") as sink:
        # started as a script's background job is: SIGINT ignored, which `fedtune run` (and
        # `flwr run` under it) inherit; a user who sends it still means stop
        proc = subprocess.Popen([str(BIN / "fedtune"), "run", "--app", str(ROOT), "--results",
                                 str(results), "--federation-config", federation,
                                 "--run-config", keys], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.time() + 300
        while f"round 3/{ROUNDS}" not in out.read_text() and time.time() < deadline:
            assert proc.poll() is None, out.read_text()[-3000:]
            time.sleep(0.5)
        assert f"round 3/{ROUNDS}" in out.read_text(), out.read_text()[-3000:]
        running = ours(home)
        cmdlines = names(running)
        for part in ("flower-superlink", "flwr-simulation", "raylet"):
            assert part in cmdlines, cmdlines  # the tree the signal must bring down
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
        assert proc.wait(timeout=60) == 128 + signal.SIGINT
        _, alive = psutil.wait_procs(running, timeout=10)
        assert not alive, names(alive)
        assert not ours(home), names(ours(home))
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(str(home))
    log = out.read_text()
    said = log[log.index("fedtune run: interrupted (SIGINT)"):]
    folder = Path(re.search(r"results so far: (\S+)", said).group(1))
    checkpoint = folder / "checkpoint.safetensors"
    done = checkpoint_round(checkpoint)
    assert 3 <= done < ROUNDS
    assert f"last checkpoint: {checkpoint} (after round {done})" in said
    command = shlex.split(re.search(r"continue with: (.+)", said).group(1))
    assert command[:8] == ["fedtune", "run", "--app", str(ROOT), "--results", str(results),
                           "--federation-config", federation]
    resumed = parse_config_args([command[command.index("--run-config") + 1]])
    assert resumed["resume"] == str(folder)
    # the same keys continue the run (in process here: the real SuperLink's part is above),
    # for two more rounds, or three where done + 2 is pyproject's own count: beside the preset,
    # without the 'preset-overrides' that `fedtune run` adds, that would mean the preset's 2
    rounds = done + 2 if done + 2 != app_defaults()["num-server-rounds"] else done + 3
    again = Path(run_inprocess(resumed | {"num-server-rounds": rounds,
                                          "results-dir": str(tmp_path / "resumed")}))
    before = json.loads((folder / "metrics.json").read_text())[:done]
    # each round's three train tasks went to one simulated node as one message and trained
    # there together: every client's metrics come from one Ray actor process, not the server's
    # (the nodes' INFO lines: in the full log, not in the quiet view)
    assert "fedtune: client-engine batched: 3 clients' tasks to node" in \
        (home / "last-run.log").read_text()
    for m in before:
        assert not m["rejected"] and sorted(m["client-metrics"]) == ["0", "1", "2"], m
        pids = {c["pid"] for c in m["client-metrics"].values()}
        assert len(pids) == 1 and m["server"]["pid"] not in pids, m
    after = json.loads((again / "metrics.json").read_text())
    assert [m["round"] for m in after] == list(range(1, rounds + 1))
    assert [(m["accuracy"], m["loss"]) for m in after[:done]] == \
        [(m["accuracy"], m["loss"]) for m in before]
