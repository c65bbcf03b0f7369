"""Masked, example-weighted aggregation (FedRA Eq. 2) and the checks a reply must pass first.

For every tensor name: the weighted mean over the clients that sent it, weights = their example
counts; a name nobody sent keeps its previous value. With names that carry the global block
index, this one rule serves every layer, the head, and any other key namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ClientUpdate:
    client: str  # who sent it (for logs)
    tensors: dict[str, np.ndarray]
    num_examples: int


def reply_problem(tensors: dict[str, np.ndarray], sent: dict[str, np.ndarray],
                  num_examples, max_examples: int | None = None) -> str | None:
    """Why a reply must be rejected, or None if it is sound. ``sent`` is what the client got."""
    if missing := sorted(set(sent) - set(tensors)):
        return f"missing tensors {missing[:3]}{'...' if len(missing) > 3 else ''}"
    if extra := sorted(set(tensors) - set(sent)):
        return f"tensors outside its plan {extra[:3]}{'...' if len(extra) > 3 else ''}"
    for name, value in tensors.items():
        ref = sent[name]
        if value.shape != ref.shape or value.dtype != ref.dtype:
            return (f"'{name}' has shape {value.shape} dtype {value.dtype}, expected "
                    f"{ref.shape} {ref.dtype}")
        if not np.isfinite(value).all():
            return f"'{name}' has NaN or Inf values"
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) \
            or num_examples <= 0:
        return f"num-examples = {num_examples!r}, expected a positive integer"
    if max_examples is not None and num_examples > max_examples:
        return f"num-examples = {num_examples} exceeds the {max_examples} it declared at start"
    return None


def masked_weighted_mean(state: dict[str, np.ndarray],
                         updates: list[ClientUpdate]) -> dict[str, np.ndarray]:
    """New global state; ``state`` itself is not modified. Updates are summed in the order of
    their client ids, so the result does not depend on the order replies arrived in (Ray hands
    them over as they complete) and a seed reproduces it to the last bit."""
    sums: dict[str, np.ndarray] = {}
    weights: dict[str, float] = {}
    for update in sorted(updates, key=lambda u: u.client):
        for name, value in update.tensors.items():
            sums[name] = sums.get(name, 0.0) + value.astype(np.float64) * update.num_examples
            weights[name] = weights.get(name, 0.0) + update.num_examples
    new_state = dict(state)
    for name, total in sums.items():
        new_state[name] = (total / weights[name]).astype(state[name].dtype)
    return new_state


def keyed_weighted_mean(state: dict[str, np.ndarray], updates: list[ClientUpdate],
                        keys: dict[str, str]) -> dict[str, np.ndarray]:
    """``masked_weighted_mean`` where tensors with the same key share one value: the weighted
    mean of every tensor of that key that was sent (by any client, under any of its names),
    written to all names of the key; a key nobody sent keeps its values. With keys = names it
    is ``masked_weighted_mean``. (FlexiFed's common layers, pFedLoRA's shared adapters.)"""
    sums: dict[str, np.ndarray] = {}
    weights: dict[str, float] = {}
    for update in sorted(updates, key=lambda u: u.client):
        for name, value in update.tensors.items():
            key = keys[name]
            sums[key] = sums.get(key, 0.0) + value.astype(np.float64) * update.num_examples
            weights[key] = weights.get(key, 0.0) + update.num_examples
    new_state = dict(state)
    for name, key in keys.items():
        if key in sums:
            new_state[name] = (sums[key] / weights[key]).astype(state[name].dtype)
    return new_state
