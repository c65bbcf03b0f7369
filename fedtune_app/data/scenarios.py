"""Capacity profiles: how many blocks each client can hold, from a few config lines.

| profile      | config                                                   | client i's capacity         |
| ------------ | -------------------------------------------------------- | --------------------------- |
| list         | capacities = "12,10,8,6,4,3" (or "4*6": all smaller)     | capacities[i]               |
| per-domain   | capacities = one per domain, clients-per-domain = k      | capacities[i // k]          |
| ratio        | capacities = levels "3,6,9,12", capacity-ratio = "3:3:2:2", num-clients = N | levels in those proportions over N clients, placed by a seeded permutation |
| + dynamic    | dynamic-capacities = true (with any of the above)        | each round ~ U[1, capacity_i], drawn by the strategy's seeded RNG |

"All clients smaller than the server" is a list whose every entry is below the model's depth.
"""  # noqa: E501  (the table's rows)

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np

from fedtune_app.config import ConfigError, RunConfig, register_derived


@lru_cache(maxsize=8)
def _ratio_capacities(levels: tuple[int, ...], ratio: tuple[int, ...], n: int,
                      seed: int) -> tuple[int, ...]:
    """n clients over the levels in proportion to ``ratio`` (largest remainders), then a seeded
    permutation decides which partition gets which level."""
    capacities = np.repeat(levels, proportional_counts(ratio, n))
    return tuple(int(c) for c in np.random.default_rng(seed).permutation(capacities))


def proportional_counts(weights, n: int) -> np.ndarray:
    """n split in proportion to ``weights``: floors, then the largest remainders get one more."""
    share = np.asarray(weights, dtype=float) / np.sum(weights) * n
    counts = np.floor(share).astype(int)
    for j in np.argsort(-(share - counts), kind="stable")[: n - counts.sum()]:
        counts[j] += 1
    return counts


def num_clients(run: RunConfig) -> int:
    """How many clients (partitions) the scenario has."""
    fed = run.federation
    derived = {"list": len(fed.capacity_list),
               "per-domain": len(fed.capacity_list) * run.data.clients_per_domain,
               "ratio": fed.num_clients}[fed.capacity_profile]
    if fed.capacity_profile == "ratio" and not derived:
        raise ConfigError("run-config key 'capacity-profile' = 'ratio' needs 'num-clients' > 0")
    if fed.num_clients and fed.num_clients != derived:
        raise ConfigError(f"run-config key 'num-clients' = {fed.num_clients} but the "
                          f"capacity profile {fed.capacity_profile!r} describes {derived} "
                          "clients (set num-clients = 0 to derive it)")
    return derived


def client_capacities(run: RunConfig) -> list[int]:
    """The (static) capacity of every partition 0..N-1."""
    fed = run.federation
    capacities = list(fed.capacity_list)
    n = num_clients(run)
    if fed.capacity_profile == "list":
        return capacities
    if fed.capacity_profile == "per-domain":
        return [capacities[i // run.data.clients_per_domain] for i in range(n)]
    ratio = fed.capacity_ratio_list
    if len(ratio) != len(capacities):
        raise ConfigError(f"run-config key 'capacity-ratio' = {fed.capacity_ratio!r} has "
                          f"{len(ratio)} parts but 'capacities' lists {len(capacities)} levels")
    return list(_ratio_capacities(tuple(capacities), tuple(ratio), n, run.seed))


def client_ranks(run: RunConfig, n: int) -> list[int]:
    """The LoRA rank of every partition 0..n-1: key 'ranks' (one per client, or one for all),
    else 'lora-r' for everyone. A rank is a capacity one level down: client i holds the first
    r_i components of every LoRA it trains (rows of A, columns of B)."""
    given, top = list(run.federation.rank_list), run.adapter.lora_r
    if not given:
        return [top] * n
    if len(given) == 1:
        given *= n
    if len(given) != n:
        raise ConfigError(f"run-config key 'ranks' = {run.federation.ranks!r} lists {len(given)} "
                          f"ranks but the capacity profile describes {n} clients; give one per "
                          "client or one for all")
    for rank in given:
        check_rank(rank, top, "run-config key 'ranks'")
    return given


def check_rank(rank: int, top: int, where: str) -> None:
    """A LoRA rank a client may hold: 1..lora-r (the global LoRA's rank, the largest one)."""
    if not 1 <= rank <= top:
        raise ConfigError(f"{where}: rank {rank} is outside 1..{top}; ranks run from 1 to "
                          f"run-config key 'lora-r' = {top} (raise 'lora-r' to the largest "
                          "client rank)")


def _derive(run: RunConfig) -> RunConfig:
    capacities = tuple(client_capacities(run))
    return dataclasses.replace(run, client_capacities=capacities,
                               client_ranks=tuple(client_ranks(run, len(capacities))))


# worked out once per run config: ``RunConfig.client_capacities`` and ``client_ranks``
register_derived(_derive)


def check_scenario(run: RunConfig, num_domains: int | None) -> None:
    """Clients, domains and partitioner agree (before any training starts)."""
    n = len(run.client_capacities)
    fed = run.federation
    partitioner, k = run.data.partitioner, run.data.clients_per_domain
    if fed.capacity_profile == "per-domain":
        if not partitioner.startswith("domain"):
            raise ConfigError("run-config key 'capacity-profile' = 'per-domain' needs "
                              "'partitioner' = domain or domain-dirichlet")
        given = len(fed.capacity_list)
        if num_domains is not None and given != num_domains:
            raise ConfigError(f"run-config key 'capacities' lists {given} values but the data "
                              f"set uses {num_domains} domains (capacity-profile per-domain)")
    if fed.client_sampling == "per-domain":
        if not partitioner.startswith("domain"):
            raise ConfigError("run-config key 'client-sampling' = 'per-domain' needs "
                              "'partitioner' = domain or domain-dirichlet (clients with domains)")
        k_round = fed.clients_per_round
        if k_round and num_domains is not None and k_round != num_domains:
            raise ConfigError(f"run-config key 'clients-per-round' = {k_round} but "
                              f"'client-sampling' = 'per-domain' draws one client from each of "
                              f"the {num_domains} domains; set it to {num_domains} or 0")
    if partitioner == "group-dirichlet" and (not run.model.groups
                                             or run.model.model_group_assign != "ratio"):
        raise ConfigError("run-config key 'partitioner' = 'group-dirichlet' splits the data by "
                          "the model groups' placement: it needs 'model-groups' with "
                          "'model-group-assign' = 'ratio'")
    if partitioner.startswith("domain"):
        if not num_domains:
            raise ConfigError(f"run-config key 'partitioner' = {partitioner!r} needs a data set "
                              "with domains (multi-domain-digits, domainnet, nico++)")
        expected = num_domains * (k if partitioner == "domain-dirichlet" else 1)
        if n != expected:
            raise ConfigError(f"run-config key 'partitioner' = {partitioner!r} with "
                              f"{num_domains} domains and clients-per-domain = "
                              f"{k if partitioner == 'domain-dirichlet' else 1} makes {expected} "
                              f"clients, but the capacity profile describes {n}")
