"""One fleet, every method: a fleet's capacities as blocks, LoRA ranks and model groups, with
numbers worked out by hand, through the real run-config resolution."""

import pytest

from fedtune_app.config import ConfigError
from fedtune_app.data.fleet import (
    architecture,
    default_thresholds,
    describe,
    fleet_blocks,
    parse_fleet,
    rank_for,
)
from fedtune_app.data.groups import node_model_group
from fedtune_app.methods import resolve_config

VIT = "img_size=8,patch_size=2,in_chans=1,num_heads=2,embed_dim={d},depth={depth}"
# three tiny ViTs, smallest first: (width 16, 2 blocks), (32, 1), (32, 3)
GROUPS = [VIT.format(d=16, depth=2), VIT.format(d=32, depth=1), VIT.format(d=32, depth=3)]
FLEET = {"preset": "smoke", "model-groups": "vit_tiny_patch16_224",
         "model-group-args": ";".join(GROUPS), "model-group-sources": "random"}


def test_fractions_become_blocks_and_ranks_rounded_down_or_to_the_nearest():
    # D = 6 blocks, lora-r R = 8: 0.3 x 6 = 1.8 -> 1 (down) or 2 (nearest); 0.05 x 6 = 0.3 -> 1
    # (at least one block); ranks b R / D: 6 -> 8, 3 -> 4, 1 -> 1.33 -> 1, 2 -> 2.67 -> 2 or 3
    assert fleet_blocks("1.0,0.5,0.3,0.05", 6) == [6, 3, 1, 1]
    assert fleet_blocks("1.0,0.5,0.3,0.05", 6, "nearest") == [6, 3, 2, 1]
    assert [rank_for(b, 6, 8) for b in (6, 3, 1, 2)] == [8, 4, 1, 2]
    assert [rank_for(b, 6, 8, "nearest") for b in (6, 3, 1, 2)] == [8, 4, 1, 3]
    assert rank_for(1, 12, 8) == 1  # 0.67 rounds down to 0, but a client holds rank 1 at least
    # 0.29 x 100 is 28.999999999999996 in floats: still 29 blocks
    assert fleet_blocks("0.29", 100) == [29]
    # blocks are taken as they are; 'v*n' repeats; a '.' anywhere makes them all fractions
    assert fleet_blocks("6,3*2", 6) == [6, 3, 3]
    assert parse_fleet("1,0.5") == ([1.0, 0.5], True)


@pytest.mark.parametrize("text, message", [
    ("", "expected one capacity per client"), ("a,b", "expected one capacity per client"),
    ("1.5,0.5", "1.5 is not a capacity; a fraction of the full model is in (0, 1]"),
    ("0,2", "0 is not a capacity; a number of blocks is at least 1"),
    ("7,2", "a client of 7 blocks, but the full model has 6")])
def test_a_bad_fleet_is_refused_in_one_line_naming_the_key(text, message):
    with pytest.raises(ConfigError, match="run-config key 'fleet'") as err:
        fleet_blocks(text, 6)
    assert message in str(err.value)


def test_group_thresholds_from_the_groups_parameters():
    # ViT parameters (patch 2, 1 channel, 8x8 images, 2 classes, MLP ratio 4) of width d and L
    # blocks: patch conv 4d + d, cls d, positions 17 d, final norm 2d, head 2d + 2 = 27 d + 2,
    # and per block 12 d^2 + 13 d
    sizes = [architecture("vit_tiny_patch16_224", args, 0)[1] for args in GROUPS]
    assert sizes == [27 * 16 + 2 * (12 * 16 ** 2 + 13 * 16) + 2,  # 6,994
                     27 * 32 + 1 * (12 * 32 ** 2 + 13 * 32) + 2,  # 13,570
                     27 * 32 + 3 * (12 * 32 ** 2 + 13 * 32) + 2]  # 38,978
    # D = 3 blocks of the largest: the middle group is 13,570 / 38,978 = 0.348 of it -> needs
    # ceil(1.04) = 2 blocks; the largest 3; the smallest serves everyone (1)
    assert default_thresholds(sizes, 3) == [1, 2, 3]
    with pytest.raises(ConfigError, match="smallest first"):
        default_thresholds(sizes[::-1], 3)


def client_groups(cfg) -> list[int]:
    n = len(cfg.client_capacities)
    return [node_model_group(cfg, i, n, c) for i, c in enumerate(cfg.client_capacities)]


def test_every_family_derives_its_setting_from_the_one_fleet():
    fleet = FLEET | {"fleet": "3,2,1,1"}
    depth = resolve_config(fleet | {"method": "fedra"})
    rank = resolve_config(fleet | {"method": "hetlora"})
    groups = resolve_config(fleet | {"method": "heterotune"})
    # one model for depth and rank methods: the largest group's (3 blocks)
    for cfg in (depth, rank):
        assert (cfg.model.model_groups, cfg.model.model_args) == ("", GROUPS[2])
    assert depth.client_capacities == (3, 2, 1, 1)
    assert depth.client_ranks == (8, 8, 8, 8)
    # every block, ranks b x 8 / 3: 8, 5.33 -> 5, 2.67 -> 2, 2
    assert rank.client_capacities == (3, 3, 3, 3)
    assert rank.client_ranks == (8, 5, 2, 2)
    # thresholds 1, 2, 3 blocks: 3 -> the largest, 2 -> the middle, 1 -> the smallest
    assert groups.model.model_group_capacities == "1,2,3"
    assert client_groups(groups) == [2, 1, 0, 0]
    assert describe(depth) == "blocks 3, 2, 1, 1 at LoRA rank 8"
    assert describe(rank) == "LoRA rank 8, 5, 2, 2 in all 3 blocks"
    assert describe(groups) == "model group 2, 1, 0, 0 (0 = smallest)"
    # the same fleet as fractions: 1.0, 0.5 x 3 = 1.5 -> 1, 0.34 x 3 = 1.02 -> 1, 0.3 -> 0.9 -> 1
    fractions = FLEET | {"fleet": "1.0,0.5,0.34,0.3"}
    assert resolve_config(fractions | {"method": "fedra"}).client_capacities == (3, 1, 1, 1)
    assert client_groups(resolve_config(fractions | {"method": "homo"})) == [2, 0, 0, 0]
    # rank methods as depth methods: their blocks at rank lora-r
    as_depth = resolve_config(fleet | {"method": "hetlora", "fleet-rank-methods": "depth"})
    assert (as_depth.client_capacities, as_depth.client_ranks) == ((3, 2, 1, 1), (8, 8, 8, 8))


def test_the_fleet_replaces_capacities_and_keeps_given_group_thresholds():
    # no model groups: the full model is key 'model' (smoke: a 4-block MLP-Mixer)
    cfg = resolve_config({"preset": "smoke", "fleet": "0.5*4", "capacity-profile": "ratio",
                          "capacity-ratio": "1:1", "num-clients": 6})
    assert cfg.client_capacities == (2, 2, 2, 2)
    fleet = FLEET | {"fleet": "3,2,1,1", "method": "heterotune"}
    given = resolve_config(fleet | {"model-group-capacities": "1,3,3"})
    assert client_groups(given) == [2, 0, 0, 0]
    with pytest.raises(ConfigError, match="'model-group-capacities' = '2,2,3': a client of the "
                                          "fleet holds 1 blocks, below the smallest group"):
        resolve_config(fleet | {"model-group-capacities": "2,2,3"})
