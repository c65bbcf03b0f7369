"""Long phases say how far they are, as rounds do: done / total, elapsed and ETA.

A server-side phase that can run for minutes (FedDF's and FedBRICK's server distillation,
publishing a checkpoint) logs one line at most every ``every`` seconds; the first line comes
only once ``every`` seconds have passed, so a phase that ends sooner (a smoke run's) stays
silent. The lines go to the ``fedtune`` logger, beside the round lines.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("fedtune")
EVERY = 10.0  # seconds between two progress lines of one phase


def clock(seconds: float) -> str:
    """1:02:03 / 2:03"""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """``advance()`` after each unit of ``total`` (steps, epochs, parts); ``what`` names the
    phase and ``unit`` its units in the log line."""

    def __init__(self, what: str, total: int, unit: str = "steps", every: float | None = None,
                 timer=time.monotonic):
        self.what, self.total, self.unit, self.timer = what, total, unit, timer
        self.every = EVERY if every is None else every
        self.done = 0
        self.started = self.last = timer()

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self.timer()
        if now - self.last >= self.every and self.done < self.total:
            self.last = now
            log.info(self.line(now))

    def line(self, now: float) -> str:
        elapsed = now - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        return (f"{self.what}: {self.done}/{self.total} {self.unit} | elapsed {clock(elapsed)} | "
                f"ETA {clock(eta)}")
