"""The method registry: every method module registers itself when it is imported.

A method is a composition of an allocation policy and an aggregation rule (its ``strategy``, a
``LayerPlanStrategy``), a client recipe (local loss and steps, default: the plain task loss), the
run-config keys it owns and a check of its config. ``register_method`` records all of that in
one call at the end of the method's module, in the spirit of timm's ``register_model``;
``fedtune_app.methods`` imports every module of this package, so a new method is one new file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fedtune_app.config import (
    ConfigError,
    ConfigPart,
    HeldOut,
    NoKeys,
    RunConfig,
    did_you_mean,
    register_keys,
)
from fedtune_app.federated.objectives import objective_of
from fedtune_app.training.recipes import ClientRecipe


@dataclass(frozen=True)
class Method:
    name: str
    strategy: type | None  # one backbone for every client
    group_strategy: type | None  # model groups (key 'model-groups'): one backbone per group
    recipe: type
    check: Callable[[dict], None] | None
    holdout: str | None  # 'proxy' or 'public': data its server keeps out of the clients'
    fixed_group: int | None  # over model groups, the group of every client
    objective_hook: Callable[[RunConfig], tuple[str, float] | None] | None
    ceiling: bool  # an upper bound of the comparison (AllLarge), never "the best competitor"

    def held_out(self, run: RunConfig) -> HeldOut:
        """What this run's server keeps out of every client's training data: the proxy split
        when the method keeps one (and 'proxy-held-out'), for every method with
        'proxy-for-all-methods', and always as FLTrust's root set; the public set of FedMD and
        FedDF."""
        data = run.data
        if data.proxy_for_all_methods and self.holdout == "public":
            raise ConfigError(f"run-config key 'proxy-for-all-methods' = true cannot be combined "
                              f"with method {self.name!r}: its public split ('public-fraction') "
                              "already takes its own share of the clients' data")
        proxy = data.proxy_fraction > 0 and (
            run.robust.aggregator == "fltrust" or data.proxy_held_out and (
                self.holdout == "proxy" or data.proxy_for_all_methods))
        return HeldOut(proxy=data.proxy_fraction if proxy else 0.0,
                       public=run.own.public_fraction if self.holdout == "public" else 0.0)

    def objective(self, run: RunConfig) -> tuple[str, float]:
        """The run's local objective: the method's own (its ``objective`` hook), else key
        'local-objective'; FedDyn only where the strategy ends with its server step."""
        own = self.objective_hook(run) if self.objective_hook else None
        if own is not None:
            return own
        kind, coef = objective_of(run.training)
        strategies = [c for c in (self.strategy, self.group_strategy) if c is not None]
        if kind == "feddyn" and not all(c.feddyn_server_step for c in strategies):
            raise ConfigError(f"run-config key 'local-objective' = 'feddyn' is not available with "
                              f"method {self.name!r} (its aggregation has no FedDyn server "
                              "step); allowed there: plain, fedprox")
        return kind, coef


METHODS: dict[str, Method] = {}


def register_method(name: str, *, strategy: type | None = None,
                    group_strategy: type | None = None, recipe: type = ClientRecipe,
                    config: type[ConfigPart] = NoKeys,
                    check: Callable[[dict], None] | None = None,
                    holdout: str | None = None, fixed_group: int | None = None,
                    objective: Callable[[RunConfig], tuple[str, float] | None] | None = None,
                    ceiling: bool = False) -> None:
    """Register method ``name`` (its run-config value of key ``method``).

    holdout: data its server keeps out of every client's partition, 'proxy' (FedBRICK's
    distillation set) or 'public' (FedMD/FedDF's public set). fixed_group: over model groups,
    the group every client runs (0 = smallest, -1 = largest; AllSmall / AllLarge). objective:
    the method's own local objective ((kind, coefficient), or None for key 'local-objective').
    ceiling: the method is an upper bound of a comparison (AllLarge), not a competitor."""
    if name in METHODS:
        raise ValueError(f"method {name!r} is already registered")
    if strategy is None and group_strategy is None:
        raise ValueError(f"method {name!r} needs a strategy or a group_strategy")
    register_keys(f"method {name}", config, method=name)
    METHODS[name] = Method(name, strategy, group_strategy, recipe, check, holdout, fixed_group,
                           objective, ceiling)


def method_of(cfg: RunConfig) -> Method:
    if cfg.method not in METHODS:
        raise ConfigError(f"run-config key 'method' = {cfg.method!r} is not allowed;"
                          f"{did_you_mean(cfg.method, METHODS)} "
                          f"allowed: {', '.join(sorted(METHODS))}")
    return METHODS[cfg.method]
