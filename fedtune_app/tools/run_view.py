"""What `fedtune run` shows of `flwr run`'s output by default (``--verbose``: every line).

The log file (``$FLWR_HOME/last-run.log``) always holds every line. The quiet view shows
fedtune's round lines, its waits (for the nodes to start, for a round's replies) and every
warning or error (fedtune's, Flower's, a node's in Ray); it hides Flower's and Ray's INFO lines,
the Flower CLI's progress lines, the libraries' Python warnings, and the results folder, which
`fedtune run` prints once, last. A run that fails shows the end of the log (``tail``).
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

# a line a Ray actor printed: "(ClientAppActor pid=8116) text", the prefix coloured
RAY_ACTOR = re.compile(r"^(?:\x1b\[\d+m)?\([\w.]+ pid=\d+(?:, ip=[\d.]+)?\)(?:\x1b\[0m)? ")
# Flower's log lines: "INFO :      text", the level coloured
FLOWER = re.compile(r"^(?:\x1b\[\d+m)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*(?:\x1b\[0m)?\s*:"
                    r"\s*(.*)$")
# fedtune's (``config.setup_logging``): "12:00:00 fedtune text"
FEDTUNE = re.compile(r"^\d\d:\d\d:\d\d fedtune (.*)$")
# fedtune's lines the quiet view shows, by how they begin
SHOWN = ("round ", "waiting for ", "warning: ", "error: ")
# Flower's warnings that tell a fedtune user nothing: `fedtune run` sizes the federation itself
HARMLESS = ("default simulated SuperNodes changed",)
TAIL_LINES = 20


def quiet(line: str) -> bool:
    """Whether the quiet view shows this line of `flwr run`'s output."""
    text = RAY_ACTOR.sub("", line.rstrip("\n"))
    if match := FEDTUNE.match(text):
        return match.group(1).startswith(SHOWN)
    if match := FLOWER.match(text):
        level, message = match.groups()
        return level in ("WARNING", "ERROR", "CRITICAL") and not any(
            harmless in message for harmless in HARMLESS)
    return False


def tail(log: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a log, for a run that failed under the quiet view."""
    with log.open(errors="replace") as f:
        return "".join(deque(f, maxlen=lines))
