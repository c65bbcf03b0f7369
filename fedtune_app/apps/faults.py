"""Fault injection, for reliability tests only (run-config key ``fault-injection``; empty in
every real run). The real ClientApp, under the real engine (in-process test grid, Ray, or a
deployed SuperNode), misbehaves on purpose so a test can check that the server survives it:

    raise=<partition-id>   training raises: the engine turns it into an error reply
    nan=<partition-id>     the reply's tensors are NaN (a diverged or malicious update)

Items are comma separated, e.g. ``raise=1,nan=2``. Faults that only a transport can produce
(a dropped, repeated, stray or tampered reply) are made by the test grid instead.
"""

from __future__ import annotations

import numpy as np

from fedtune_app.config import parse_faults

class InjectedFault(RuntimeError):
    """The failure a ``raise=<pid>`` item asks for."""


def before_training(cfg: dict, partition_id: int) -> None:
    if parse_faults(cfg["fault-injection"]).get(partition_id) == "raise":
        raise InjectedFault(f"fault-injection: client {partition_id} fails on purpose")


def after_training(cfg: dict, partition_id: int,
                   tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if parse_faults(cfg["fault-injection"]).get(partition_id) == "nan":
        return {name: np.full_like(value, np.nan) for name, value in tensors.items()}
    return tensors
