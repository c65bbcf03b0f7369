"""One fleet, every method: the clients' devices as capacities, and what each method makes of them.

Key ``fleet`` lists one capacity per client, as fractions of the full model (``"1.0,0.5,0.3"``: a
'.' anywhere makes every entry a fraction in (0, 1]) or as blocks of its depth (``"6,3,2"``);
``v*n`` repeats v n times. The full model is the largest model group's (the last of
``model-groups``) when groups are set, else key ``model``; D is its number of blocks, R = key
``lora-r``. A capacity c first becomes whole blocks b = c D (rounded by ``fleet-rounding``, down
by default; at least 1); every method family then derives its setting from b:

- depth methods (fedra, depthfl, inclusivefl, fedbrick, all-small, all-large): b_i blocks
  (key ``capacities``);
- rank methods (fedit, hetlora, flexlora, flora, ffa-lora, fedsa-lora, fedex-lora): every block
  at LoRA rank r_i = b_i R / D (rounded as b, 1..R), which trains as many parameters as b_i
  blocks at rank R (``fleet-rank-methods = depth``: b_i blocks at rank R, as a depth method);
- model-group methods (homo, heterotune, fedmd, feddf, flexifed, pfedlora): the largest group
  whose threshold in ``model-group-capacities`` b_i reaches.

Thresholds of the model groups (in blocks of the full model): key ``model-group-capacities``, or
by default ceil(s_g D) for a group with s_g of the largest group's parameters, and 1 for the
smallest group (every client runs at least the smallest model). Methods that run one model run
the full one: with model groups, the largest group's ``model``, ``model-args``, ``model-source``.

Worked example, D = 6, R = 8, fleet "1.0,0.5,0.3": blocks 6, 3, 1 (0.3 x 6 = 1.8 down), ranks
8, 4, 1 (1 x 8 / 6 = 1.33 down); with ``fleet-rounding = nearest``: blocks 6, 3, 2, ranks 8, 4, 3.

The fleet's setting is written into the run's keys (``fleet_keys``), so a run's config.json
says what its method got, and ``fedtune run`` and ``fedtune compare`` treat it alike.
"""

from __future__ import annotations

import math

from fedtune_app.config import ConfigError, ModelConfig, RunConfig, parse_int_list

# the keys a fleet sets: they follow from the fleet and the method, not from the scenario
FLEET_KEYS = ("capacities", "ranks", "capacity-profile", "num-clients", "model", "model-args",
              "model-source", "model-groups", "model-group-assign", "model-group-capacities")
# client keys that hold whatever the fleet replaces: a neutral setting to read the fleet with
FLEET_NEUTRAL = {"capacity-profile": "list", "num-clients": 0, "ranks": ""}
EXAMPLE = "fractions of the full model ('1.0,0.5,0.3') or blocks of its depth ('6,3,2')"


def parse_fleet(text: str) -> tuple[list[float], bool]:
    """(capacities, whether they are fractions): '1.0,0.5*2' -> ([1.0, 0.5, 0.5], True)."""
    fractions = "." in text
    values = []
    try:
        for item in filter(None, text.replace(" ", "").split(",")):
            value, _, times = item.partition("*")
            values += [float(value) if fractions else int(value)] * (int(times) if times else 1)
    except ValueError:
        values = []
    if not values:
        raise ConfigError(f"run-config key 'fleet' = {text!r}: expected one capacity per client, "
                          f"comma separated: {EXAMPLE}; 'v*n' repeats v n times")
    bad = [v for v in values if not (0 < v <= 1 if fractions else v >= 1)]
    if bad:
        raise ConfigError(f"run-config key 'fleet' = {text!r}: {bad[0]} is not a capacity; "
                          + ("a fraction of the full model is in (0, 1]" if fractions
                             else "a number of blocks is at least 1"))
    return values, fractions


def whole(x: float, rounding: str) -> int:
    """x as a whole number: down (a hair of float error forgiven: 0.29 x 100 is 29) or nearest."""
    return math.floor(x + (0.5 if rounding == "nearest" else 1e-9))


def fleet_blocks(text: str, depth: int, rounding: str = "down") -> list[int]:
    """Every client's blocks of the full model (``depth`` blocks)."""
    values, fractions = parse_fleet(text)
    if not fractions:
        if max(values) > depth:
            raise ConfigError(f"run-config key 'fleet' = {text!r}: a client of {max(values)} "
                              f"blocks, but the full model has {depth}")
        return values
    return [max(1, whole(c * depth, rounding)) for c in values]


def rank_for(blocks: int, depth: int, top: int, rounding: str = "down") -> int:
    """The LoRA rank whose D blocks train what ``blocks`` blocks at rank ``top`` train."""
    return min(top, max(1, whole(blocks * top / depth, rounding)))


def default_thresholds(sizes: list[int], depth: int) -> list[int]:
    """Blocks of the full model a client needs for each group (``sizes``: parameters, smallest
    group first): ceil(share of the largest x depth), the smallest group 1."""
    if sizes != sorted(sizes):
        raise ConfigError("run-config key 'model-groups': with a 'fleet' the groups are listed "
                          f"smallest first, but their parameters are {sizes}")
    return [1] + [max(1, math.ceil(s / sizes[-1] * depth - 1e-9)) for s in sizes[1:]]


def family(method, run: RunConfig) -> str:
    """'depth', 'rank' or 'model-group': how ``method`` (a registered Method) uses a fleet."""
    if method.strategy is None:
        return "model-group"
    if getattr(method.strategy, "rank_heterogeneous", False) and \
            run.federation.fleet_rank_methods == "rank":
        return "rank"
    return "depth"


def full_model(model: ModelConfig) -> dict[str, str]:
    """Keys 'model', 'model-args', 'model-source' of the full model: the largest group's."""
    if model.groups:
        return dict(model.groups[-1])
    return {"model": model.model, "model-args": model.model_args,
            "model-source": model.model_source}


def architecture(name: str, args: str, seed: int) -> tuple[int, int]:
    """(blocks, parameters) of a backbone, built on the meta device: no weights read."""
    from fedtune_app.model import backbones

    return backbones.architecture(backbones.ModelSpec(name, "random", args, seed))


def fleet_keys(run: RunConfig, method) -> dict:
    """The run keys that give ``method`` its setting of the fleet (key 'fleet' of ``run``)."""
    fed, seed = run.federation, run.model.model_seed
    full = full_model(run.model)
    depth, _ = architecture(full["model"], full["model-args"], seed)
    blocks = fleet_blocks(fed.fleet, depth, fed.fleet_rounding)
    keys = FLEET_NEUTRAL | {"capacities": ",".join(map(str, blocks))}
    kind = family(method, run)
    if kind == "model-group":
        thresholds = run.model.model_group_capacities.strip() or ",".join(map(str, (
            default_thresholds([architecture(g["model"], g["model-args"], seed)[1]
                                for g in run.model.groups], depth) if run.model.groups
            else [])))
        if thresholds and min(blocks) < parse_int_list("model-group-capacities", thresholds)[0]:
            raise ConfigError(f"run-config key 'model-group-capacities' = {thresholds!r}: a "
                              f"client of the fleet holds {min(blocks)} blocks, below the "
                              "smallest group's threshold, and would run no model")
        return keys | {"model-group-assign": "capacity", "model-group-capacities": thresholds}
    keys |= full | {"model-groups": ""}  # one model for every client: the full one
    if kind == "rank":
        top = run.adapter.lora_r
        keys |= {"capacities": ",".join([str(depth)] * len(blocks)),
                 "ranks": ",".join(str(rank_for(b, depth, top, fed.fleet_rounding))
                                   for b in blocks)}
    return keys


def describe(run: RunConfig) -> str:
    """What each client got of the fleet in this (resolved) run, for a comparison's notes."""
    from fedtune_app.data.groups import node_model_group

    capacities = run.client_capacities
    if run.model.groups:
        n = len(capacities)
        groups = [node_model_group(run, i, n, c) for i, c in enumerate(capacities)]
        return "model group " + ", ".join(map(str, groups)) + " (0 = smallest)"
    if run.federation.ranks.strip():
        return f"LoRA rank {', '.join(map(str, run.client_ranks))} in all {capacities[0]} blocks"
    return f"blocks {', '.join(map(str, capacities))} at LoRA rank {run.adapter.lora_r}"
