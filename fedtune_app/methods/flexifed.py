"""FlexiFed: federated learning over clients with heterogeneous architectures (Wang et al.,
WWW'23), its three sharing strategies (``flexifed-strategy``); "common layers" are counted
from the input up to the first layer that differs:
  * Basic-Common: the layers common to ALL architectures are aggregated over every client;
    the rest only among clients of identical architecture;
  * Clustered-Common: architectures are clustered, and Basic-Common runs inside each cluster
    (how to cluster is our reading: the architectures whose first layer is the same, i.e.
    those of one width);
  * Max-Common (default): every pair of architectures shares its own longest common prefix.
HeteroTune names the strategy it ran only by "simply aggregating the largest overlapping parts
of the models": Max-Common, the default.

Here an architecture is a model group (``groups.<g>.`` tensors) and its layers are its
blocks in order followed by the head; a layer's signature is the set of its trainable tensors
(block-relative name and shape). Per round:
  1. clients train their group's tensors (plain local training, the default recipe);
  2. for every pair of groups g, h: c(g, h) = the number of leading layers with equal
     signatures; layer k of g and layer k of h share one value when k < c(g, h). Sharing is an
     equivalence per layer (equal prefixes are transitive), so each layer's tensors fall into
     classes;
  3. each class gets the example-weighted mean over every client that sent one of its tensors
     (``aggregation.keyed_weighted_mean``); a class nobody sent keeps its value.
Groups of different widths share nothing under any of the three (their adapters differ in shape
from block 0): FlexiFed then equals Homo-training. HeteroTune reports FlexiFed 2-5 points BELOW
Homo over ViT-T/S/B/L (all of different widths); none of FlexiFed's strategies can produce that
on adapters of different shapes: it would need slicing tensors across widths (as HeteroFL
does), which FlexiFed does not define and which is not implemented here.

Choices made here: example-weighted means (FlexiFed averages by data size too); the head counts
as the last layer, so two groups share it only when their whole models match; with adapters
only they and the heads travel, with 'client-trains = full' (HeteroTune's reading of FlexiFed)
every weight does, and the stem and final norm join the head's class: shared only between
identical models (FlexiFed's first layer would be the stem; ours, no difference when the
groups' widths differ, as in HeteroTune's presets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedtune_app.config import ConfigPart, config_key
from fedtune_app.methods.model_groups import GroupStrategy
from fedtune_app.methods.registry import register_method
from fedtune_app.model.adapters import block_of

GROUPS = "groups."


def split_name(name: str) -> tuple[int | None, str]:
    """``groups.1.blocks.0.x`` -> (1, ``blocks.0.x``); a shared name -> (None, name)."""
    if not name.startswith(GROUPS):
        return None, name
    _, g, rest = name.split(".", 2)
    return int(g), rest


def layers(shapes: dict[str, tuple]) -> list[frozenset]:
    """One group's layers in order (blocks, then the head and any other non-block tensor), each
    as its signature: {(name relative to the block, shape)}."""
    blocks: dict[int, set] = {}
    rest = set()
    for name, shape in shapes.items():
        j = block_of(name)
        if j is None:
            rest.add((name, tuple(shape)))
        else:
            blocks.setdefault(j, set()).add((name.split(".", 2)[2], tuple(shape)))
    ordered = [frozenset(blocks[j]) for j in sorted(blocks)]
    return ordered + ([frozenset(rest)] if rest else [])


def common_prefix(signatures: list[list[frozenset]]) -> int:
    """Number of leading layers all the given architectures have equal."""
    count = 0
    for layer in zip(*signatures):
        if any(sig != layer[0] for sig in layer):
            break
        count += 1
    return count


def sharing_groups(sigs: dict[int, list[frozenset]], g: int, k: int, strategy: str) -> list[int]:
    """The groups whose layer k is averaged together with group g's."""
    same = [h for h in sigs if sigs[h] == sigs[g]]  # identical architectures share everything
    if strategy == "max-common":
        return [h for h in sigs if sigs[h][:k + 1] == sigs[g][:k + 1]]
    cluster = list(sigs) if strategy == "basic-common" else \
        [h for h in sigs if sigs[h][:1] == sigs[g][:1]]
    return cluster if k < common_prefix([sigs[h] for h in cluster]) else same


def common_keys(state: dict[str, np.ndarray], strategy: str = "max-common") -> dict[str, str]:
    """Name -> the key of the class it is averaged in (``strategy``: max-common, basic-common
    or clustered-common). Names of one class share a key; a shared (ungrouped) name is its own
    key."""
    by_group: dict[int, dict[str, tuple]] = {}
    key = {}
    for name, value in state.items():
        g, rest = split_name(name)
        if g is None:
            key[name] = name
        else:
            by_group.setdefault(g, {})[rest] = np.shape(value)
    sigs = {g: layers(shapes) for g, shapes in by_group.items()}
    for g, shapes in by_group.items():
        order = [j for j in sorted({block_of(n) for n in shapes if block_of(n) is not None})]
        for rest in shapes:
            j = block_of(rest)
            k = order.index(j) if j is not None else len(order)
            # the class of layer k: named by the smallest group that shares it with g
            owner = min(sharing_groups(sigs, g, k, strategy))
            local = rest if j is None else rest.split(".", 2)[2]
            key[f"{GROUPS}{g}.{rest}"] = f"layer{k}/{owner}/{local}"
    return key


class FlexiFed(GroupStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "flexifed"

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.keys = common_keys(self.state, cfg.own.flexifed_strategy)

    def aggregate(self, updates):
        return self.server_objective(updates, self.combine(updates, self.keys))


@dataclass(frozen=True)
class FlexiFedConfig(ConfigPart):
    """FlexiFed's own key."""
    flexifed_strategy: str = config_key("max-common", choices=(
        "max-common", "basic-common", "clustered-common"), help=
        "FlexiFed's sharing: every pair shares its longest common prefix (max-common; HeteroTune's"
        " 'largest overlapping parts'), only the layers common to all (basic-common), or basic-"
        "common inside clusters of equal first layer (clustered-common)")


register_method("flexifed", group_strategy=FlexiFed, config=FlexiFedConfig)
