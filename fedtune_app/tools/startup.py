"""Start-up failures of `flwr run`: a simulation that failed to start on a busy machine, told
apart from one that failed after it started.

On a machine whose cores other jobs keep busy, Ray's start-up inside Flower's simulation can
fail before the first round: the driver waits a fixed 30 s for the raylet to register with the
GCS (a local variable in ``ray._private.node.Node.__init__``), then raises "The current node
timed out during startup". The raylet does not register because it has exited: it waits a fixed
15 s for its dashboard agent (a Python process, started even with ``include_dashboard=False``)
to write its port file, and a starved agent, slow to import, misses that ("Timed out waiting
for file .../metrics_agent_port_..."). Neither wait can be lengthened from outside Ray
(``RAY_raylet_start_wait_time_s`` only makes the driver wait longer for a raylet that is dead;
``RAY_agent_register_timeout_ms`` is not the agent-port wait), and patching Ray's private code
would break with its next release. What helps is to start the simulation once more, and that
loses nothing: the ServerApp writes its results folder only after the nodes answered through
Ray, so before that line nothing was computed. docs/reliability.md has the measurements.

Under that load the same wait can also end at its first poll, whose connection to the starved
GCS gives up ("Failed to connect to GCS", an error the wait does not catch). `fedtune run` feeds
every line of `flwr run` to a ``StartupWatch``; when it names a start-up failure (those two, any
other error out of Flower's ``RayBackend.init_ray``, or the local SuperLink not answering `flwr
run`) before the run started, it stops `flwr run` and the local SuperLink with everything
they started, says why, and runs `flwr run` once more. A failure after the run started (its
results folder named, or a round begun) is the run's own and is never retried, nor is a second
start-up failure (a machine that busy needs its user's attention).
"""

from __future__ import annotations

import re

BUSY = "a busy machine starves Ray's start-up"
# what `flwr run` logs when the simulation did not start, and what that means for the user
STARTUP_FAILURES = {
    "The current node timed out during startup":
        f"Ray's raylet did not register with the GCS within Ray's fixed 30 s ({BUSY})",
    # the same wait's poll, when its connection to a starved GCS gives up first
    "Failed to connect to GCS. Please check":
        f"Ray's driver could not reach its GCS while it waited for the raylet ({BUSY})",
    # Flower's RayBackend.init_ray in a traceback: any other error of Ray's start-up
    ", in init_ray": "Ray did not start (the error above)",
    "Connection to the SuperLink is unavailable":
        "the local SuperLink that `flwr run` starts did not answer within the CLI's wait (a busy "
        "machine starves its start-up)",
}
# the ServerApp's first line names its results folder (``apps/server.py``): the run started
STARTED = re.compile(r"rounds; results in (\S.*?)\s*$")


class StartupWatch:
    """Fed `flwr run`'s output line by line; ``failure`` is why the simulation failed to start
    (one of ``STARTUP_FAILURES``), or None: no such failure, or it came after the run started."""

    def __init__(self):
        self.started = False
        self.failure: str | None = None

    @property
    def failed(self) -> str | None:
        """Why the simulation failed to start, if it did before the run started."""
        return None if self.started else self.failure

    def feed(self, line: str) -> str | None:
        """One line of `flwr run`'s output; returns ``failed``."""
        if STARTED.search(line) or "[ROUND " in line:
            self.started = True
        elif not self.started and self.failure is None:
            self.failure = next((why for text, why in STARTUP_FAILURES.items() if text in line),
                                None)
        return self.failed

    def scan(self, log: str) -> str | None:
        """A whole log at once (a `flwr run` that has ended); returns ``failed``."""
        for line in log.splitlines():
            self.feed(line)
        return self.failed
