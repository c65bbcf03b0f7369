"""Stop the local SuperLink that `flwr run` leaves running (detached) under one FLWR_HOME, with
every process it started (SuperExec, flwr-simulation, Ray), and nothing else.

    python -m fedtune_app.tools.local_superlink stop "$FLWR_HOME"
"""

from __future__ import annotations

import os
import sys

import psutil


def stop(flwr_home: str) -> int:
    """Kill each ``flower-superlink`` whose command line names ``flwr_home`` (its database is
    there), all its descendants and the rest of its session; returns how many processes died.
    The tree is frozen (SIGSTOP) before anything dies, pass by pass until no new child shows
    up, so a process spawned mid-way (a Ray worker) has a frozen parent and is found in the
    next pass."""
    victims: dict[int, psutil.Process] = {}
    while True:
        found = [p for p in _tree(flwr_home) if p.pid not in victims]
        if not found:
            break
        for proc in found:
            victims[proc.pid] = proc
            try:
                proc.suspend()
            except psutil.Error:
                pass
    for proc in victims.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(victims.values()), timeout=10)
    return len(victims)


def _tree(flwr_home: str) -> list[psutil.Process]:
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "flower-superlink" in cmdline and flwr_home in cmdline:
            roots.append(proc)
    tree = []
    for root in roots:
        try:
            tree += [root, *root.children(recursive=True)]
        except psutil.Error:
            pass
    # `flwr run` starts the SuperLink as a session of its own, and the SuperLink its SuperExec
    # (the simulation's parent): a session keeps what it started even when their parent dies,
    # as a raylet that gave up at start-up leaves its agents to init. (Only sessions that
    # processes of the tree lead: a SuperLink started from a shell shares the shell's.)
    sessions = {proc.pid for proc in tree if _session(proc.pid) == proc.pid}
    if sessions:
        tree += [p for p in psutil.process_iter() if _session(p.pid) in sessions]
    return tree


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone
        return None


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "stop":
        sys.exit("usage: python -m fedtune_app.tools.local_superlink stop FLWR_HOME")
    print(f"stopped {stop(sys.argv[2])} processes of the local SuperLink in {sys.argv[2]}")
