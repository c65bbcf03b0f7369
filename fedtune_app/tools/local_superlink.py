"""Stop the local SuperLink that `flwr run` leaves running (detached) under one FLWR_HOME, with
every process it started (SuperExec, flwr-simulation, Ray), and nothing else.

    python -m fedtune_app.tools.local_superlink stop "$FLWR_HOME"
"""

from __future__ import annotations

import sys

import psutil


def stop(flwr_home: str) -> int:
    """Kill each ``flower-superlink`` whose command line names ``flwr_home`` (its database is
    there) and all its descendants; returns how many processes died."""
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "flower-superlink" in cmdline and flwr_home in cmdline:
            roots.append(proc)
    victims = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    for proc in victims.values():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(victims.values()), timeout=10)
    return len(victims)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "stop":
        sys.exit("usage: python -m fedtune_app.tools.local_superlink stop FLWR_HOME")
    print(f"stopped {stop(sys.argv[2])} processes of the local SuperLink in {sys.argv[2]}")
