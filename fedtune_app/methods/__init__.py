"""The federated methods, one module each; importing this package registers them all.

Every module of this package (but ``registry``) is imported in name order and registers its
method(s) with ``registry.register_method``: a new method is one new file here.
"""

import dataclasses
import importlib
import pkgutil

from fedtune_app.config import ConfigError, RunConfig, register_derived, resolve
from fedtune_app.data.fleet import FLEET_NEUTRAL, fleet_keys
from fedtune_app.data.groups import check_groups, num_groups
from fedtune_app.data.scenarios import check_scenario
from fedtune_app.data.splits import domain_list
from fedtune_app.methods.registry import METHODS, Method, method_of, register_method
from fedtune_app.training.recipes import ClientRecipe

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "registry":
        importlib.import_module(f"{__name__}.{_module}")


def _what_the_method_says(run: RunConfig) -> RunConfig:
    """Every run config built: the data its method holds out, its fixed model group, its local
    objective."""
    method = method_of(run)
    return dataclasses.replace(run, held_out=method.held_out(run), fixed_group=method.fixed_group,
                               objective=method.objective(run))


register_derived(_what_the_method_says)

__all__ = ["METHODS", "Method", "method_of", "recipe_for", "register_method", "resolve_config",
           "strategy_class"]


def resolve_config(run_config: dict) -> RunConfig:
    """The run config, every key checked (``config.resolve``), every method's keys and rules
    known, clients, domains and partitioner agreeing, and what the method says of the run (its
    held-out data, its fixed model group): bad configuration stops here, before any training."""
    # a fleet replaces the clients' keys: read it without them, then give the method its setting
    probe = resolve(run_config, FLEET_NEUTRAL)
    fleet = probe.federation.fleet.strip()
    cfg = resolve(run_config, fleet_keys(probe, method_of(probe)) if fleet else None)
    domains = domain_list(cfg.data)
    check_scenario(cfg, None if domains is None else len(domains))
    method = method_of(cfg)
    check_groups(cfg, [m.name for m in METHODS.values() if m.strategy],
                 [m.name for m in METHODS.values() if m.group_strategy])
    cfg = resolve_client_trains(cfg)
    if method.check is not None:
        method.check(cfg)
    if cfg.federation.ranks.strip() and not strategy_class(cfg).rank_heterogeneous:
        raise ConfigError(f"run-config key 'ranks' = {cfg.federation.ranks!r} with method "
                          f"{cfg.method!r}: its clients all hold LoRA of rank 'lora-r'; methods "
                          "with clients of different ranks: " + ", ".join(sorted(
                              m.name for m in METHODS.values() if m.strategy is not None
                              and m.strategy.rank_heterogeneous)))
    if cfg.federation.min_holders > 1 and not strategy_class(cfg).draws_k_cover:
        raise ConfigError(f"run-config key 'min-holders' = {cfg.federation.min_holders} with "
                          f"method {cfg.method!r}: its allocation is not drawn to cover every "
                          "block k times; methods that draw it: " + ", ".join(sorted(
                              m.name for m in METHODS.values() if m.strategy is not None
                              and m.strategy.draws_k_cover)))
    if cfg.robust.dp_noise_multiplier > 0 and not strategy_class(cfg).private_aggregation:
        raise ConfigError(f"run-config key 'dp-noise-multiplier' > 0 with method "
                          f"{cfg.method!r}: its server step reads the clients' updates in the "
                          "clear, so client-level DP would protect nothing; methods with DP: "
                          + ", ".join(sorted(m.name for m in METHODS.values() if any(
                              c is not None and c.private_aggregation
                              for c in (m.strategy, m.group_strategy)))))
    return cfg


def resolve_client_trains(cfg: RunConfig) -> RunConfig:
    """Key 'client-trains': 'heterotune' -> full where the method can fine-tune fully, else
    adapters; 'full' for a method defined on adapters is refused."""
    can = strategy_class(cfg).full_fine_tuning
    if cfg.adapter.client_trains == "heterotune":
        return cfg.replace(**{"client-trains": "full" if can else "adapters"})
    if cfg.adapter.client_trains == "full" and not can:
        raise ConfigError(
            f"run-config key 'client-trains' = 'full' with method {cfg.method!r}: it trains "
            "adapters only (FedRA, FedBRICK, HeteroTune, pFedLoRA are defined on adapters; "
            "DepthFL, InclusiveFL are not enabled for full fine-tuning here); methods "
            "with full fine-tuning: " + ", ".join(sorted(
                m.name for m in METHODS.values()
                if any(c is not None and c.full_fine_tuning
                       for c in (m.strategy, m.group_strategy)))))
    return cfg


def recipe_for(cfg: RunConfig, group: int | None = None) -> ClientRecipe:
    return method_of(cfg).recipe(cfg, group)


def strategy_class(cfg: RunConfig):
    method = method_of(cfg)
    return method.group_strategy if num_groups(cfg.model) else method.strategy
