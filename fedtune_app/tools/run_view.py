"""What `fedtune run` shows of `flwr run`'s output by default (``--verbose``: every line).

The log file (``$FLWR_HOME/last-run.log``) always holds every line. The quiet view shows
fedtune's round lines, its waits (for the nodes to start, for a round's replies: one such line
every 30 s at most, where the log has one every few seconds) and every warning or error
(fedtune's, Flower's, a node's in Ray, and a raw Python traceback's first and last lines); it
hides Flower's and Ray's INFO lines, the Flower CLI's
progress lines, the libraries' Python warnings, and the results folder, which `fedtune run`
prints once, last. A run that fails shows the end of the log (``tail``).
"""

from __future__ import annotations

import re
import time
from collections import deque
from pathlib import Path

# a line a Ray actor printed: "(ClientAppActor pid=8116) text", the prefix coloured
RAY_ACTOR = re.compile(r"^(?:\x1b\[\d+m)?\([\w.]+ pid=\d+(?:, ip=[\d.]+)?\)(?:\x1b\[0m)? ")
# Flower's log lines: "INFO :      text", the level coloured
FLOWER = re.compile(r"^(?:\x1b\[\d+m)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*(?:\x1b\[0m)?\s*:"
                    r"\s*(.*)$")
# fedtune's (``config.setup_logging``): "12:00:00 fedtune text"
FEDTUNE = re.compile(r"^\d\d:\d\d:\d\d fedtune (.*)$")
# fedtune's lines the quiet view shows, by how they begin (and its waits, "waiting for ...")
SHOWN = ("round ", "warning: ", "error: ")
WAIT_SECONDS = 30.0  # a wait's line at most this often
# Flower's warnings that tell a fedtune user nothing: `fedtune run` sizes the federation itself,
# and Ray's actors are stopped at the end of every run
HARMLESS = ("default simulated SuperNodes changed", "Manually terminating ClientAppActor")
TAIL_LINES = 20
# a Python error printed raw (a node's or a library's): its first line and its last
RAW_ERROR = re.compile(r"^(Traceback \(most recent call last\):"
                       r"|[A-Za-z_][\w.]*(Error|Exception): )")


class QuietView:
    """Called with each line of `flwr run`'s output: whether the quiet view shows it."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.last_wait: float | None = None  # when a wait's line was last shown

    def __call__(self, line: str) -> bool:
        text = RAY_ACTOR.sub("", line.rstrip("\n"))
        if match := FEDTUNE.match(text):
            said = match.group(1)
            if said.startswith("waiting for "):
                return self.wait_due()
            return said.startswith(SHOWN)
        if match := FLOWER.match(text):
            level, message = match.groups()
            return level in ("WARNING", "ERROR", "CRITICAL") and not any(
                harmless in message for harmless in HARMLESS)
        return bool(RAW_ERROR.match(text))

    def wait_due(self) -> bool:
        now = self.clock()
        if self.last_wait is not None and now - self.last_wait < WAIT_SECONDS:
            return False
        self.last_wait = now
        return True


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a log, for a run that failed under the quiet view."""
    with log.open(errors="replace") as f:
        return "".join(deque(f, maxlen=lines))
