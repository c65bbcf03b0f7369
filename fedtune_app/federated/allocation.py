"""Layer allocation: which GLOBAL blocks each sampled client holds this round.

A plan is an ascending tuple of block indices; a round's plans form the allocation matrix
M in {0,1}^{N x L} (row i has ones at plan i). All randomness comes from the generator passed
in, so one seed gives one sequence of matrices.
"""

from __future__ import annotations

import numpy as np

from fedtune_app.config import ConfigError

Plan = tuple[int, ...]


def check_capacities(capacities, num_layers: int) -> None:
    for i, c in enumerate(capacities):
        if not 1 <= c <= num_layers:
            raise ConfigError(f"run-config key 'capacities': client {i} has capacity {c}; "
                              f"allowed: 1..{num_layers} (the model has {num_layers} blocks)")


def random_plans(capacities, num_layers: int, rng: np.random.Generator) -> list[Plan]:
    """FedRA step 1: each client an independent uniform L_i-subset of the L blocks, so layer j
    is held by client i with probability L_i / L."""
    return [tuple(sorted(rng.choice(num_layers, size=c, replace=False).tolist()))
            for c in capacities]


def covering_plans(capacities, num_layers: int, rng: np.random.Generator) -> list[Plan]:
    """FedRA Eq. 3 (v2; Eq. 4 in v1): row sums L_i and every column held at least once.

    Blocks, in random order, are dealt one each to randomly ordered capacity slots, then each
    client fills its remaining capacity with a uniform subset of the blocks it lacks. Blocks are
    exchangeable in both steps, so P(client i holds j) is still exactly L_i / L."""
    if sum(capacities) < num_layers:
        raise ConfigError(
            f"missing-layer-policy 'cover-all' needs the sampled clients to hold every block, "
            f"but their capacities {list(capacities)} sum to {sum(capacities)} < {num_layers} "
            "blocks; use missing-layer-policy=keep-previous or larger/more clients per round")
    slots = np.repeat(np.arange(len(capacities)), capacities)
    rng.shuffle(slots)
    held = [set() for _ in capacities]
    for block, client in zip(rng.permutation(num_layers), slots):
        held[client].add(int(block))
    return fill_to_capacity(held, capacities, num_layers, rng)


def fill_to_capacity(held: list[set], capacities, num_layers: int,
                     rng: np.random.Generator) -> list[Plan]:
    """Each client tops up the blocks it was dealt with a uniform subset of those it lacks."""
    for client, c in enumerate(capacities):
        lacking = np.array(sorted(set(range(num_layers)) - held[client]))
        extra = c - len(held[client])
        if extra:
            held[client].update(rng.choice(lacking, size=extra, replace=False).tolist())
    return [tuple(sorted(h)) for h in held]


def k_cover_plans(capacities, num_layers: int, rng: np.random.Generator, k: int) -> list[Plan]:
    """Every block held by at least ``k`` of the clients (Eq. 3 with k in place of 1: column sums
    >= k), row sums L_i, so that a robust aggregator always has k values per block.

    The k copies of a random permutation of the blocks, laid end to end, are cut into runs of
    L_i consecutive entries, one run per client in random order, until all k L entries are dealt
    (McNaughton's wrap-around rule: a run of at most L consecutive entries of a sequence with
    period L never repeats a block). Each client then fills its remaining capacity with a uniform
    subset of the blocks it lacks. Needs sum L_i >= k L and k <= the number of clients."""
    if k > len(capacities) or sum(capacities) < k * num_layers:
        raise ConfigError(
            f"run-config key 'min-holders' = {k}: every block held by {k} clients needs at least "
            f"{k} clients whose capacities sum to >= {k} x {num_layers} blocks = "
            f"{k * num_layers}; this round's {len(capacities)} clients have capacities "
            f"{list(capacities)} (sum {sum(capacities)})")
    sequence = np.tile(rng.permutation(num_layers), k)
    held = [set() for _ in capacities]
    start = 0
    for client in rng.permutation(len(capacities)):
        run = sequence[start:start + capacities[client]]
        held[client].update(int(b) for b in run)
        start += len(run)
    return fill_to_capacity(held, capacities, num_layers, rng)


def worst_round_capacities(capacities, per_round: int = 0, domains=None,
                           dynamic: bool = False) -> list[int]:
    """The capacities of the weakest round the sampling can draw: the ``per_round`` smallest
    (all when 0), or with ``domains`` (one client of each) each domain's smallest; under dynamic
    capacities every client may draw 1 block."""
    if domains is not None:
        smallest: dict = {}
        for c, d in zip(capacities, domains):
            smallest[d] = min(c, smallest.get(d, c))
        worst = list(smallest.values())
    else:
        worst = sorted(capacities)[:per_round or len(capacities)]
    return [1] * len(worst) if dynamic else worst


def check_k_cover(capacities, num_layers: int, k: int, per_round: int = 0, domains=None,
                  dynamic: bool = False) -> None:
    """Refuse at the start a k-cover that some round could not draw (``k_cover_plans`` needs,
    in every round, k clients whose capacities sum to k L): a run must not stop half-way."""
    worst = worst_round_capacities(capacities, per_round, domains, dynamic)
    if k > len(worst) or sum(worst) < k * num_layers:
        how = ("one client of each domain" if domains is not None else
               f"'clients-per-round' = {per_round}" if per_round else "all clients")
        raise ConfigError(
            f"run-config key 'min-holders' = {k}: every block held by {k} clients needs, in "
            f"every round, {k} clients whose capacities sum to >= {k} x {num_layers} blocks = "
            f"{k * num_layers}; the weakest round {how} can draw has capacities {worst} (sum "
            f"{sum(worst)}{', dynamic capacities draw 1 each' if dynamic else ''}): lower "
            "'min-holders', or sample more clients")


def prefix_plans(capacities, num_layers: int, rng=None) -> list[Plan]:
    """Depth-based baselines: client i holds the first L_i blocks."""
    return [tuple(range(c)) for c in capacities]


def full_plans(capacities, num_layers: int, rng=None) -> list[Plan]:
    """AllLarge: every client holds all L blocks (capacity ignored: the ceiling)."""
    return [tuple(range(num_layers)) for _ in capacities]


def smallest_prefix_plans(capacities, num_layers: int, rng=None, smallest: int | None = None):
    """AllSmall: every client holds the first min_i L_i blocks."""
    depth = min(capacities) if smallest is None else smallest
    return [tuple(range(depth)) for _ in capacities]


def allocation_matrix(plans: list[Plan], num_layers: int) -> np.ndarray:
    m = np.zeros((len(plans), num_layers), dtype=np.int8)
    for i, plan in enumerate(plans):
        m[i, list(plan)] = 1
    return m


def draw_round_capacities(capacities: list[int], rng: np.random.Generator) -> list[int]:
    """Dynamic heterogeneity: this round's capacity of each client ~ U[1, its capacity]."""
    return [int(rng.integers(1, c + 1)) for c in capacities]
