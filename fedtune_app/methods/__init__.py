"""One module per method; ``STRATEGIES`` maps the run-config ``method`` to its strategy class and
``RECIPES`` to its client recipe when it has its own (the default: plain task loss)."""

from ..recipes import ClientRecipe
from .baselines import AllLarge, AllSmall
from .depthfl import DepthFL, DepthFLRecipe
from .fedbrick import FedBRICK, FedBRICKRecipe
from .feddf import FedDF
from .fedmd import FedMD, FedMDRecipe
from .fedra import FedRA
from .flexifed import FlexiFed
from .heterotune import HeteroTune, HeteroTuneRecipe
from .inclusivefl import InclusiveFL
from .model_groups import GroupAllLarge, GroupAllSmall, Homo
from .pfedlora import PFedLoRA, PFedLoRARecipe

STRATEGIES = {"fedra": FedRA, "all-large": AllLarge, "all-small": AllSmall,
              "inclusivefl": InclusiveFL, "depthfl": DepthFL, "fedbrick": FedBRICK}
RECIPES = {"depthfl": DepthFLRecipe, "fedbrick": FedBRICKRecipe, "heterotune": HeteroTuneRecipe,
           "fedmd": FedMDRecipe, "pfedlora": PFedLoRARecipe}
# runs with model groups (key 'model-groups' set): one backbone per group
GROUP_STRATEGIES = {"all-small": GroupAllSmall, "all-large": GroupAllLarge, "homo": Homo,
                    "heterotune": HeteroTune, "fedmd": FedMD, "feddf": FedDF, "flexifed": FlexiFed,
                    "pfedlora": PFedLoRA}


def recipe_for(cfg: dict, group: int | None = None) -> ClientRecipe:
    return RECIPES.get(cfg["method"], ClientRecipe)(cfg, group)


def strategy_class(cfg: dict):
    from ..groups import num_groups

    return (GROUP_STRATEGIES if num_groups(cfg) else STRATEGIES)[cfg["method"]]
