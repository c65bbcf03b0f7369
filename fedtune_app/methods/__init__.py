"""One module per method; ``STRATEGIES`` maps the run-config ``method`` to its strategy class and
``RECIPES`` to its client recipe when it has its own (the default: plain task loss)."""

from ..recipes import ClientRecipe
from .baselines import AllLarge, AllSmall
from .depthfl import DepthFL, DepthFLRecipe
from .fedbrick import FedBRICK, FedBRICKRecipe
from .fedra import FedRA
from .inclusivefl import InclusiveFL

STRATEGIES = {"fedra": FedRA, "all-large": AllLarge, "all-small": AllSmall,
              "inclusivefl": InclusiveFL, "depthfl": DepthFL, "fedbrick": FedBRICK}
RECIPES = {"depthfl": DepthFLRecipe, "fedbrick": FedBRICKRecipe}


def recipe_for(cfg: dict) -> ClientRecipe:
    return RECIPES.get(cfg["method"], ClientRecipe)(cfg)
