"""Fault injection, for reliability tests only (run-config key ``fault-injection``; empty in
every real run). The real ClientApp, under the real engine (in-process test grid, Ray, or a
deployed SuperNode), misbehaves on purpose so a test can check that the server survives it:

    raise=<partition-id>    training raises: the engine turns it into an error reply
    nan=<partition-id>      the reply's tensors are NaN (a diverged or malicious update)

and the well-formed, finite attacks that only update screening and robust aggregation stop
(w = the tensor received, v = the tensor trained):

    huge=<partition-id>     every value 1e30 (finite; the next round's training overflows)
    flip=<partition-id>     the update sign-flipped and scaled 100 times: w - 100 (v - w)
    noise=<partition-id>    noise of the right shape: w + N(0, 1), seeded by (seed, round,
                            partition)
    diverge=<partition-id>  v x 1e4: finite, plausible-looking values whose next round of
                            training diverges

Items are comma separated, e.g. ``raise=1,nan=2``. Faults that only a transport can produce
(a dropped, repeated, stray or tampered reply) are made by the test grid instead.
"""

from __future__ import annotations

import numpy as np

from fedtune_app.config import RunConfig, parse_faults

FLIP_SCALE = 100.0


class InjectedFault(RuntimeError):
    """The failure a ``raise=<pid>`` item asks for."""


def before_training(cfg: RunConfig, partition_id: int) -> None:
    if parse_faults(cfg.federation.fault_injection).get(partition_id) == "raise":
        raise InjectedFault(f"fault-injection: client {partition_id} fails on purpose")


def after_training(cfg: RunConfig, partition_id: int, tensors: dict[str, np.ndarray],
                   received: dict[str, np.ndarray], server_round: int) -> dict[str, np.ndarray]:
    fault = parse_faults(cfg.federation.fault_injection).get(partition_id)
    if fault == "nan":
        return {name: np.full_like(value, np.nan) for name, value in tensors.items()}
    if fault == "huge":
        return {name: np.full_like(value, 1e30) for name, value in tensors.items()}
    if fault == "diverge":
        return {name: value * np.float32(1e4) for name, value in tensors.items()}
    sent = {name: received.get(name, value) for name, value in tensors.items()}
    if fault == "flip":
        return {name: (sent[name] - FLIP_SCALE * (value - sent[name])).astype(value.dtype)
                for name, value in tensors.items()}
    if fault == "noise":
        rng = np.random.default_rng([cfg.seed, server_round, partition_id])
        return {name: (sent[name] + rng.standard_normal(value.shape)).astype(value.dtype)
                for name, value in sorted(tensors.items())}
    return tensors
