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

from fedtune_app.config import ConfigError, ConfigPart, NoKeys, did_you_mean, register_keys
from fedtune_app.data.groups import FIXED_GROUP
from fedtune_app.data.splits import HOLDOUTS
from fedtune_app.training.recipes import ClientRecipe


@dataclass(frozen=True)
class Method:
    name: str
    strategy: type | None  # one backbone for every client
    group_strategy: type | None  # model groups (key 'model-groups'): one backbone per group
    recipe: type
    check: Callable[[dict], None] | None


METHODS: dict[str, Method] = {}


def register_method(name: str, *, strategy: type | None = None,
                    group_strategy: type | None = None, recipe: type = ClientRecipe,
                    config: type[ConfigPart] = NoKeys,
                    check: Callable[[dict], None] | None = None,
                    holdout: str | None = None, fixed_group: int | None = None) -> None:
    """Register method ``name`` (its run-config value of key ``method``).

    holdout: data its server keeps out of every client's partition, 'proxy' (FedBRICK's
    distillation set) or 'public' (FedMD/FedDF's public set). fixed_group: over model groups,
    the group every client runs (0 = smallest, -1 = largest; AllSmall / AllLarge)."""
    if name in METHODS:
        raise ValueError(f"method {name!r} is already registered")
    if strategy is None and group_strategy is None:
        raise ValueError(f"method {name!r} needs a strategy or a group_strategy")
    register_keys(f"method {name}", config, method=name)
    if holdout is not None:
        HOLDOUTS[name] = holdout
    if fixed_group is not None:
        FIXED_GROUP[name] = fixed_group
    METHODS[name] = Method(name, strategy, group_strategy, recipe, check)


def method_of(cfg: dict) -> Method:
    if cfg["method"] not in METHODS:
        raise ConfigError(f"run-config key 'method' = {cfg['method']!r} is not allowed;"
                          f"{did_you_mean(cfg['method'], METHODS)} "
                          f"allowed: {', '.join(sorted(METHODS))}")
    return METHODS[cfg["method"]]
