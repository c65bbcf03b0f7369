"""What `fedtune run` and `fedtune compare` refuse before Flower starts.

``resolve_config`` (``fedtune_app.methods``) has checked every key, the scenario, the ranks and
the model groups already. What it cannot check needs the model, the data or the machine (which
runs the simulation): the ServerApp would refuse those only after Ray started the nodes
(~50 s), in a traceback. Here each is one
``ConfigError`` line naming the key, its value and what is wrong, by the same checks the
ServerApp makes (the method's ``check_fleet``), on the model's architecture alone (the meta
device: no weights are read).
"""

from __future__ import annotations

from pathlib import Path

from fedtune_app.config import ConfigError, RunConfig
from fedtune_app.data.groups import group_config, group_depths, num_groups
from fedtune_app.data.splits import describe_data
from fedtune_app.methods import strategy_class
from fedtune_app.model.backbones import ModelSpec, architecture_depth
from fedtune_app.training.local import check_precision, pick_device


def preflight(cfg: RunConfig, origins: dict | None = None) -> str:
    """Raise ConfigError for a run that would fail once Flower has started; else return the
    line that says what data it uses (``describe_data``, with ``origins``)."""
    check_machine(cfg)
    check_fleet(cfg)
    return check_data(cfg, origins)


def check_machine(cfg: RunConfig) -> None:
    """A GPU (with bfloat16) where the run asks for one."""
    check_precision(cfg.training.precision, pick_device(cfg.training.device))


def model_depth(cfg: RunConfig) -> int:
    """Blocks of the run's backbone as the ServerApp builds it (model groups: the deepest
    group's, as ``GroupedModel.num_blocks``)."""
    if num_groups(cfg.model):
        return max(group_depths(cfg))
    return architecture_depth(ModelSpec.from_config(cfg.model, 2))  # classes: no depth


def check_fleet(cfg: RunConfig) -> None:
    """The clients' capacities on this model (deeper than the model, no DepthFL exit, below
    every model group's threshold)."""
    strategy_class(cfg).check_fleet(cfg, list(cfg.client_capacities), model_depth(cfg))


def check_data(cfg: RunConfig, origins: dict | None = None) -> str:
    """The data the run reads, loaded and split as the nodes will (a path that is not there, a
    data set that cannot be read, no usable label or input column, sizes the split cannot
    give): its description line (no tensor is made, so this takes what loading takes)."""
    folder = cfg.data.data_dir
    if folder and not Path(folder).expanduser().is_dir():
        raise ConfigError(f"run-config key 'data-dir' = {folder!r}: no such folder")
    model = group_config(cfg, 0).model if num_groups(cfg.model) else cfg.model
    return describe_data(cfg.data, origins, ModelSpec.from_config(model, 2))
