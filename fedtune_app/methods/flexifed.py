"""FlexiFed: federated learning over clients with heterogeneous architectures (Wang et al.,
WWW'23), in two readings (``flexifed-aggregation``): FlexiFed's own (strict: only identical
layers are averaged) and HeteroTune's (overlap: the overlapping slices of tensors of different
widths are averaged).

Strict (the default), FlexiFed's three sharing strategies (``flexifed-strategy``); "common
layers" are counted from the input up to the first layer that differs:
  * Basic-Common: the layers common to ALL architectures are aggregated over every client;
    the rest only among clients of identical architecture;
  * Clustered-Common: architectures are clustered, and Basic-Common runs inside each cluster
    (how to cluster is our reading: the architectures whose first layer is the same, i.e.
    those of one width);
  * Max-Common (default): every pair of architectures shares its own longest common prefix.
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
Groups of different widths share nothing under any of the three (their tensors differ in shape
from block 0): strict FlexiFed then equals Homo-training, run for run. Choices made here:
example-weighted means (FlexiFed averages by data size too); the head counts as the last layer,
so two groups share it only when their whole models match; with adapters only they and the
heads travel, with 'client-trains = full' (HeteroTune's reading of FlexiFed) every weight does,
and the stem and final norm join the head's class: shared only between identical models
(FlexiFed's first layer would be the stem; ours, no difference when the groups' widths differ,
as in HeteroTune's presets).

Overlap, HeteroTune's reading. HeteroTune reports FlexiFed BELOW Homo in every column of its
Table 1 (ViT-T/S/B/L, all of different widths; by 1.5 to 10.5 points, CIFAR-10 Avg 61.36
against 66.14), which strict FlexiFed cannot give, and describes it as "identifying the largest
common parts between models for aggregation" (Sec. 4, comparison methods) and "simply
aggregating the largest overlapping parts of the models" (Sec. 4.2): tensors of different
widths overlap in their leading slices, as in HeteroFL. Here a tensor of group g corresponds
to the tensor of the same group-relative name in every other group (``blocks.3.mlp.fc1.weight``:
block 3 of every group that has one, so the common depth prefix by block index; the stem, final
norm and head by name), and each ELEMENT of it becomes the example-weighted mean over every
client whose group's tensor holds that element. Two groups with shapes (2, 3) and (3, 4): the
overlap [:2, :3] is averaged over both groups' clients, the rest of the (3, 4) tensor over its
own group's. Over more widths each pair shares its largest overlap (Max-Common in width as in
depth: ``flexifed-strategy`` must be max-common). Computed by cutting every tensor at the sizes
its name has across the groups, so that each piece is held by one set of groups, averaging the
pieces through the run's aggregator (``combine``) and putting them back. Choices the paper
leaves open: leading slices of EVERY dimension, the fused q|k|v rows of a timm ViT's
``attn.qkv`` too (a small model's k rows meet a larger one's q rows; separately pretrained
widths have no aligned units in any case, and it is what slicing a state dict generically
does); a name only one group has (its deeper blocks) stays that group's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from fedtune_app.config import ConfigError, ConfigPart, RunConfig, config_key
from fedtune_app.federated.aggregation import ClientUpdate
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


Piece = tuple[str, tuple[slice, ...]]  # (key shared by the groups that hold it, its slices)


def overlap_pieces(shapes: dict[str, tuple]) -> dict[str, list[Piece]]:
    """Name -> the pieces its tensor is cut into for the overlap reading. Per group-relative
    name (and number of dimensions), every dimension is cut at the sizes it has in the groups
    holding the name; a piece's key is the name and its intervals, so the groups sharing a key
    are exactly those whose tensor holds that piece. A shared (ungrouped) name is one piece."""
    by_class: dict[tuple[str, int], dict[str, tuple]] = {}
    for name, shape in shapes.items():
        g, rest = split_name(name)
        by_class.setdefault((name if g is None else rest, len(shape)), {})[name] = tuple(shape)
    pieces = {}
    for (rest, _), members in by_class.items():
        cuts = [sorted({0, *sizes}) for sizes in zip(*members.values())]
        for name, shape in members.items():
            spans = [[(a, b) for a, b in zip(c, c[1:]) if b <= size]
                     for c, size in zip(cuts, shape)]
            pieces[name] = [(f"{rest}@{list(box)}", tuple(slice(a, b) for a, b in box))
                            for box in itertools.product(*spans)]
    return pieces


def cut(tensors: dict[str, np.ndarray], pieces: dict[str, list[Piece]]) -> dict[str, np.ndarray]:
    """Each tensor's pieces as tensors of their own, named ``<name>#<i>``."""
    return {f"{name}#{i}": value[box] for name, value in tensors.items()
            for i, (_, box) in enumerate(pieces[name])}


def join(cut_state: dict[str, np.ndarray], like: dict[str, np.ndarray],
         pieces: dict[str, list[Piece]]) -> dict[str, np.ndarray]:
    """The tensors of ``like`` (names, shapes, dtypes) put together from their pieces."""
    out = {}
    for name, value in like.items():
        whole = np.empty_like(value)
        for i, (_, box) in enumerate(pieces[name]):
            whole[box] = cut_state[f"{name}#{i}"]
        out[name] = whole
    return out


class FlexiFed(GroupStrategy):
    full_fine_tuning = True  # plain averaging of whatever the clients train
    name = "flexifed"

    def __init__(self, cfg, clients, num_layers, initial_state):
        super().__init__(cfg, clients, num_layers, initial_state)
        self.overlap = cfg.own.flexifed_aggregation == "overlap"
        if self.overlap:
            self.pieces = overlap_pieces({n: np.shape(v) for n, v in self.state.items()})
            self.piece_keys = {f"{name}#{i}": key for name, cuts in self.pieces.items()
                               for i, (key, _) in enumerate(cuts)}
        else:
            self.keys = common_keys(self.state, cfg.own.flexifed_strategy)

    def aggregate(self, updates):
        if not self.overlap:
            return self.server_objective(updates, self.combine(updates, self.keys))
        pieces = [ClientUpdate(u.client, cut(u.tensors, self.pieces), u.num_examples)
                  for u in updates]
        mean = self.combine(pieces, self.piece_keys, cut(self.state, self.pieces))
        return self.server_objective(updates, join(mean, self.state, self.pieces))


@dataclass(frozen=True)
class FlexiFedConfig(ConfigPart):
    """FlexiFed's own keys. FlexiFed's paper (Wang et al., WWW'23; not among the stored seed
    papers, its strategies as this module's docstring gives them) averages layers identical
    from the input up: Basic-Common, Clustered-Common, Max-Common. HeteroTune (Sec. 4): "FlexiFed
    approaches aggregation from the model structure perspective, identifying the largest common
    parts between models for aggregation"; Sec. 4.2: "simply aggregating the largest
    overlapping parts of the models is only suitable for small models"."""
    flexifed_strategy: str = config_key("max-common", choices=(
        "max-common", "basic-common", "clustered-common"), help=
        "FlexiFed's sharing: every pair shares its longest common prefix (max-common), only the "
        "layers common to all (basic-common), or basic-common inside clusters of equal first "
        "layer (clustered-common)")
    flexifed_aggregation: str = config_key("strict", choices=("strict", "overlap"), help=
        "FlexiFed: average only layers identical from the input up (strict, FlexiFed's paper; "
        "groups of different widths then share nothing and FlexiFed equals homo), or every "
        "element of a tensor over the groups whose tensor of that name holds it (overlap, "
        "HeteroTune's reading: 'the largest overlapping parts', leading slices of tensors of "
        "different widths, blocks by index; needs flexifed-strategy = max-common)")


def check(cfg: RunConfig) -> None:
    own = cfg.own
    if own.flexifed_aggregation == "overlap" and own.flexifed_strategy != "max-common":
        raise ConfigError(f"run-config key 'flexifed-strategy' = {own.flexifed_strategy!r} "
                          "with 'flexifed-aggregation' = 'overlap': overlap shares every pair's "
                          "largest overlap (max-common); allowed: max-common")


register_method("flexifed", group_strategy=FlexiFed, config=FlexiFedConfig, check=check)
