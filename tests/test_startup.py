"""A simulation that starts on a busy machine: `fedtune run` starts it once more when Ray's
start-up fails, and only then (``fedtune_app/tools/startup.py``)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fedtune_app.tools.local_superlink import stop
from fedtune_app.tools.startup import StartupWatch

ROOT = Path(__file__).resolve().parent.parent
# lines of `flwr run --stream` as they came (Flower's colour codes included)
RAY_TIMED_OUT = ("\x1b[91mERROR \x1b[0m:     An exception occured!! The current node timed out "
                 "during startup. This could happen because some of the raylet failed to startup "
                 "or the GCS has become overloaded.")
NO_GCS = ("\x1b[91mERROR \x1b[0m:     An exception occured!! System error: Failed to connect to "
          "GCS. Please check if the GCS server is running and if this node can connect to the "
          "head node.")
IN_INIT_RAY = ('  File "/v/lib/python3.11/site-packages/flwr/server/superlink/fleet/vce/backend/'
               'raybackend.py", line 119, in init_ray')
NO_SUPERLINK = ("Connection to the SuperLink is unavailable. Please check your network "
                "connectivity and verify that the SuperLink address is correct.")
RESULTS_NAMED = ("14:38:54 fedtune fedtune: fedra on mixer_s16_224, 3 clients [4, 2, 1], 2 rounds; "
                 "results in /tmp/r/fedra-seed0-20261128-143854")
ROUND_1 = "\x1b[92mINFO \x1b[0m:      [ROUND 1/2]"
BEFORE = ["Starting local SuperLink on 127.0.0.1:51185...", "Successfully started run 1534",
          "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation",
          "14:38:22 fedtune asking new node(s) [3664274283494021446] which partition they hold"]


def test_a_start_up_failure_before_the_run_started_is_retried_and_nothing_else():
    watch = StartupWatch()
    assert [watch.feed(line) for line in BEFORE] == [None] * 4
    assert watch.feed(RAY_TIMED_OUT).startswith("Ray's raylet did not register with the GCS "
                                                "within Ray's fixed 30 s")
    assert StartupWatch().scan("\n".join(["", NO_SUPERLINK])).startswith(
        "the local SuperLink that `flwr run` starts did not answer")
    # the same wait, when its poll's connection to a starved GCS gives up first; and any other
    # error out of Ray's start-up, known by Flower's frame in its traceback
    assert StartupWatch().scan("\n".join(BEFORE + [NO_GCS, "Traceback", IN_INIT_RAY])) == (
        "Ray's driver could not reach its GCS while it waited for the raylet (a busy machine "
        "starves Ray's start-up)")
    assert StartupWatch().scan("\n".join(BEFORE + ["ValueError: bad", "Traceback",
                                                   IN_INIT_RAY])) == \
        "Ray did not start (the error above)"
    # the run's own failures: a bad config, a crash, and Ray failing once the run had started
    # (its results folder named, or a round begun), which a new start must not repeat
    for log in (BEFORE + ["'capacities': client 0 has capacity 9; allowed: 1..4",
                          "\x1b[91mERROR \x1b[0m:     Exit Code: 700"],
                BEFORE + [RESULTS_NAMED, RAY_TIMED_OUT],
                BEFORE + [ROUND_1, "Exception: The current node timed out during startup."]):
        assert StartupWatch().scan("\n".join(log)) is None, log
    watch = StartupWatch()
    watch.feed(RAY_TIMED_OUT)
    assert watch.feed(RESULTS_NAMED) is None  # a run that started after all is not restarted


# stand-ins for the local SuperLink (its command line names it and FLWR_HOME) and the SuperExec
# it starts as a session of its own; that one starts a process that starts another and exits,
# as a raylet that gave up leaves its agents to init
SUPERLINK = """import subprocess, sys, time
superexec = ("import subprocess, sys, time; "
             "subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]]); time.sleep(60)")
starter = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
           "'import time; time.sleep(60)']); open(sys.argv[1], 'w').write(str(p.pid))")
subprocess.Popen([sys.executable, "-c", superexec, starter, sys.argv[2] + "/orphan"],
                 start_new_session=True)
time.sleep(60)
"""


def test_stopping_the_superlink_ends_what_a_dead_parent_left_in_its_sessions(tmp_path):
    """`flwr run` starts the SuperLink as a session of its own, and the SuperLink its SuperExec;
    a process whose parent died is no descendant of theirs any more but still in one of their
    sessions, and stop ends it too."""
    link = subprocess.Popen([sys.executable, "-c", SUPERLINK, "flower-superlink", str(tmp_path)],
                            start_new_session=True)
    orphan = None
    try:
        deadline = time.monotonic() + 30
        while not (pid := read(tmp_path / "orphan")) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphan = psutil.Process(int(pid))
        while orphan in psutil.Process(link.pid).children(recursive=True) and \
                time.monotonic() < deadline:  # until its parent has exited
            time.sleep(0.05)
        assert orphan not in psutil.Process(link.pid).children(recursive=True)
        assert stop(str(tmp_path)) == 3  # the SuperLink, the SuperExec and the orphan
        assert not orphan.is_running() and link.poll() is not None
    finally:
        link.kill()
        if orphan is not None and orphan.is_running():
            orphan.kill()


def read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


SPIN = ("import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end: pass")


def raylet_session(home: Path) -> int | None:
    """The session of the raylet that runs under this FLWR_HOME: the SuperExec's (the local
    SuperLink starts it as a session of its own), which holds the simulation and all of Ray."""
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "raylet" and proc.environ().get("FLWR_HOME") == str(home):
                return os.getsid(proc.pid)
        except (psutil.Error, OSError):
            pass
    return None


def starve(session: int, seconds: float, until=lambda: False) -> None:
    """A busy machine, for ``seconds`` or until ``until()``: a busy loop per core at normal
    priority, every process of ``session`` (new ones too) at the lowest, nice 19, and so the
    session's autogroup where the kernel groups processes by session (nice then counts only
    within a group)."""
    loops = [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)])
             for _ in range(os.cpu_count() or 1)]
    grouped = False
    while any(loop.poll() is None for loop in loops):
        if until():
            for loop in loops:
                loop.kill()
            break
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) != session:
                    continue
                if proc.nice() < 19:
                    proc.nice(19)
                if not grouped:
                    Path(f"/proc/{proc.pid}/autogroup").write_text("19")
                    grouped = True
            except (psutil.Error, OSError):  # gone, or no autogroups here: nice is enough
                pass
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.stress  # the kernel's share-out decides when Ray fails: `make test-stress` only
def test_fedtune_run_starts_once_more_when_a_busy_machine_starved_ray(tmp_path):
    """The smoke preset through `fedtune run` while, from the moment Ray's raylet appears until
    its first start-up has failed (60 s at most), the simulation gets next to no CPU: the
    raylet does not register within Ray's fixed 30 s ("The current node timed out during
    startup"; in 2 of 10 such runs the driver's poll could not reach the starved GCS first),
    `fedtune run` says so, starts the simulation once more, and prints the results folder of a
    complete run."""
    home, results, out = tmp_path / "flwr-home", tmp_path / "results", tmp_path / "out.log"
    env = os.environ | {"FLWR_HOME": str(home), "PYTHONPATH": str(ROOT)}
    with out.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "fedtune_app.tools.cli", "run", "--app",
                                 str(ROOT), "--results", str(results), "--run-config",
                                 'preset="smoke" seed=5'], cwd=tmp_path, env=env,
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while (session := raylet_session(home)) is None and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()[-3000:]
            time.sleep(0.1)
        assert session is not None, "no raylet started"
        # until the first start-up has failed: a failure at the driver's first poll comes early,
        # and a load still on would starve the second start-up too
        starve(session, 60, until=lambda: "starting the simulation once more" in out.read_text())
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(str(home))
    said = out.read_text()
    assert proc.returncode == 0, said[-3000:] + read(home / "last-run.log")[-6000:]
    # the load stopped Ray's first start-up (mostly the raylet that never registers, at times
    # the driver's connection to the GCS: tools/startup.py), and `fedtune run` said so
    notes = [line for line in said.splitlines() if "starting the simulation once more" in line]
    assert len(notes) == 1 and notes[0].startswith("fedtune run: Ray's ") and notes[0].endswith(
        "(a busy machine starves Ray's start-up); starting the simulation once more"), notes
    assert notes[0] in (home / "last-run.log").read_text()
    folder = Path(said.strip().splitlines()[-1])
    assert folder.parent == results and list(results.iterdir()) == [folder]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    # nothing of either start is left, not even the agents of the raylet that gave up
    assert not [p.pid for p in psutil.process_iter() if flwr_home(p) == str(home)]


def flwr_home(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get("FLWR_HOME")
    except psutil.Error:
        return None
