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

from functools import lru_cache

import numpy as np

from fedtune_app.config import ConfigError, parse_int_list


def parse_ratio(text: str, key: str = "capacity-ratio") -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(":") if v]
    except ValueError:
        values = []
    if not values or min(values) < 0 or sum(values) == 0:
        raise ConfigError(f"run-config key '{key}' = {text!r}: expected non-negative "
                          "integers separated by ':', e.g. '3:3:2:2'")
    return values


@lru_cache(maxsize=8)
def _ratio_capacities(levels: tuple[int, ...], ratio: tuple[int, ...], n: int,
                      seed: int) -> tuple[int, ...]:
    """n clients over the levels in proportion to ``ratio`` (largest remainders), then a seeded
    permutation decides which partition gets which level."""
    share = np.asarray(ratio, dtype=float) / sum(ratio) * n
    counts = np.floor(share).astype(int)
    for j in np.argsort(-(share - counts), kind="stable")[: n - counts.sum()]:
        counts[j] += 1
    capacities = np.repeat(levels, counts)
    return tuple(int(c) for c in np.random.default_rng(seed).permutation(capacities))


def num_clients(cfg: dict) -> int:
    """How many clients (partitions) the scenario has."""
    capacities = parse_int_list("capacities", cfg["capacities"])
    derived = {"list": len(capacities),
               "per-domain": len(capacities) * cfg["clients-per-domain"],
               "ratio": cfg["num-clients"]}[cfg["capacity-profile"]]
    if cfg["capacity-profile"] == "ratio" and not derived:
        raise ConfigError("run-config key 'capacity-profile' = 'ratio' needs 'num-clients' > 0")
    if cfg["num-clients"] and cfg["num-clients"] != derived:
        raise ConfigError(f"run-config key 'num-clients' = {cfg['num-clients']} but the "
                          f"capacity profile {cfg['capacity-profile']!r} describes {derived} "
                          "clients (set num-clients = 0 to derive it)")
    return derived


def client_capacities(cfg: dict) -> list[int]:
    """The (static) capacity of every partition 0..N-1."""
    capacities = parse_int_list("capacities", cfg["capacities"])
    profile = cfg["capacity-profile"]
    n = num_clients(cfg)
    if profile == "list":
        return capacities
    if profile == "per-domain":
        return [capacities[i // cfg["clients-per-domain"]] for i in range(n)]
    ratio = parse_ratio(cfg["capacity-ratio"])
    if len(ratio) != len(capacities):
        raise ConfigError(f"run-config key 'capacity-ratio' = {cfg['capacity-ratio']!r} has "
                          f"{len(ratio)} parts but 'capacities' lists {len(capacities)} levels")
    return list(_ratio_capacities(tuple(capacities), tuple(ratio), n, cfg["seed"]))


def check_scenario(cfg: dict, num_domains: int | None) -> None:
    """Clients, domains and partitioner agree (before any training starts)."""
    n = num_clients(cfg)
    client_capacities(cfg)
    partitioner, k = cfg["partitioner"], cfg["clients-per-domain"]
    if cfg["capacity-profile"] == "per-domain":
        if not partitioner.startswith("domain"):
            raise ConfigError("run-config key 'capacity-profile' = 'per-domain' needs "
                              "'partitioner' = domain or domain-dirichlet")
        given = len(parse_int_list("capacities", cfg["capacities"]))
        if num_domains is not None and given != num_domains:
            raise ConfigError(f"run-config key 'capacities' lists {given} values but the data "
                              f"set uses {num_domains} domains (capacity-profile per-domain)")
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
