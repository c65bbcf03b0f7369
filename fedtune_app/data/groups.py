"""Model groups: clients that run different backbones (model heterogeneity, HeteroTune Sec. 3).

A run with ``model-groups`` set has M >= 1 model groups g = 0..M-1, listed smallest model first,
each with its own backbone (timm name or Hugging Face encoder), constructor arguments and weights
(``model-group-args`` / ``model-group-sources``, ';'-separated; one entry serves every group):

    model-groups        = "vit_tiny_patch16_224;vit_tiny_patch16_224"
    model-group-args    = "embed_dim=16,depth=2,...;embed_dim=32,depth=2,..."
    model-group-sources = "random"

A client's group comes from its partition id (``model-group-assign = ratio``: the groups in
``model-group-ratio`` proportions, e.g. 3:3:2:2, placed by the same seeded permutation as the
ratio capacity profile) or from its declared capacity (``capacity``: the largest group whose
threshold in ``model-group-capacities`` the capacity reaches). AllSmall / AllLarge put every
client in group 0 / M-1.

Global state names of group-specific tensors carry the prefix ``groups.<g>.``, so the masked
weighted mean aggregates each group's tensors over that group's clients only, and a method may
add unprefixed tensors that every group shares (HeteroTune's share-adapters).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from torch import nn

from fedtune_app.config import ConfigError, ModelConfig, RunConfig
from fedtune_app.model.backbones import ModelSpec

PREFIX = "groups."


def prefix(group: int) -> str:
    return f"{PREFIX}{group}."


def group_of_name(name: str) -> int | None:
    """``groups.1.blocks.0.x`` -> 1; a name outside every group (shared) -> None."""
    if not name.startswith(PREFIX):
        return None
    return int(name.split(".", 2)[1])


def group_specs(model: ModelConfig) -> list[dict]:
    """Per group: its values of the keys 'model', 'model-args', 'model-source' ([] = no groups;
    parsed with the run config, ``ModelConfig.groups``)."""
    return list(model.groups)


def num_groups(model: ModelConfig) -> int:
    return len(model.groups)


def group_config(run: RunConfig, group: int | None) -> RunConfig:
    """The run config as group ``group``'s nodes see it (its model keys); None: unchanged."""
    return run if group is None else run.replace(**run.model.groups[group])


def node_model_group(run: RunConfig, partition_id: int, num_partitions: int,
                     capacity: int) -> int | None:
    """The model group of a node (None: a single-model run)."""
    model = run.model
    m = num_groups(model)
    if not m:
        return None
    if run.fixed_group is not None:  # AllSmall / AllLarge: one group for every client
        return run.fixed_group % m
    if model.model_group_assign == "capacity":
        fits = [g for g, t in enumerate(model.group_thresholds) if t <= capacity]
        if not fits:
            raise ConfigError(f"client {partition_id} has capacity {capacity}, below every "
                              f"threshold of run-config key 'model-group-capacities' = "
                              f"{model.model_group_capacities!r}")
        return fits[-1]
    return ratio_groups(run, num_partitions)[partition_id]


def ratio_groups(run: RunConfig, num_partitions: int) -> tuple[int, ...]:
    """Every partition's model group under ``model-group-ratio`` (the seeded placement), also for
    AllSmall / AllLarge, whose clients all run one group: partitioner ``group-dirichlet`` splits
    the data by this placement, so every arm of a setting trains on the same client data."""
    from fedtune_app.data.scenarios import _ratio_capacities

    m = num_groups(run.model)
    return _ratio_capacities(tuple(range(m)), run.model.group_ratio, num_partitions, run.seed)


def check_groups(run: RunConfig, single_model_methods, group_methods) -> None:
    """The method runs over model groups if and only if the run has them."""
    if not run.model.groups:
        if run.method not in single_model_methods:
            raise ConfigError(f"run-config key 'method' = {run.method!r} needs model groups: "
                              "set 'model-groups' (e.g. two timm models separated by ';'), or "
                              "take preset 'smoke-groups' (the smoke run over two model groups)")
        return
    if run.method not in group_methods:
        raise ConfigError(f"run-config key 'method' = {run.method!r} does not run over model "
                          f"groups ('model-groups' is set); allowed: {', '.join(group_methods)}")


def group_depths(run: RunConfig) -> list[int]:
    """Blocks of each group's backbone (its architecture only: no weights are read)."""
    from fedtune_app.model.backbones import architecture_depth

    return [architecture_depth(replace(ModelSpec.from_config(group_config(run, g).model, 2),
                                       source="random"))
            for g in range(num_groups(run.model))]


class GroupedModel(nn.Module):
    """The server's global models, one per group (``groups.<g>.`` in parameter names)."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        self.groups = nn.ModuleList(models)

    @property
    def num_blocks(self) -> int:
        return max(m.num_blocks for m in self.groups)


class GroupedRecipe:
    """The per-group client recipes seen from the server: initial state of all groups."""

    def __init__(self, recipes: list):
        self.recipes = recipes

    def initial_state(self, model: GroupedModel, seed: int) -> dict[str, np.ndarray]:
        state = {}
        for recipe, sub in zip(self.recipes, model.groups):
            state |= recipe.initial_state(sub, seed)  # shared names: the same from every group
        return state

    def update_bounds(self, sent: dict[str, np.ndarray], num_examples: int, server_round: int,
                      max_batches: int = 0) -> dict[str, float]:
        """Each group's recipe's bounds on the tensors it was sent (its group's names)."""
        return {name: bound for recipe in self.recipes
                for name, bound in recipe.update_bounds(sent, num_examples, server_round,
                                                        max_batches).items()}
