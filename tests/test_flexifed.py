"""FlexiFed's two readings: strict (identical layers only, FlexiFed's paper) and overlap (the
overlapping slices of tensors of different widths, HeteroTune's reading), by hand and over a
real two-group federation in process."""

import numpy as np
import pytest

from fedtune_app.config import ConfigError
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.methods import resolve_config
from fedtune_app.methods.flexifed import FlexiFed, overlap_pieces
from floats import assert_rounded_mean
from test_comparators import results, run_recording


def f32(rows):
    return np.array(rows, dtype=np.float32)


def flexifed(state, aggregation):
    """The server strategy of a smoke-groups run over the given state (two groups)."""
    cfg = resolve_config({"preset": "smoke-groups", "method": "flexifed",
                          "flexifed-aggregation": aggregation})
    return FlexiFed(cfg, [], 3, state)


# group 0 holds a 2 x 3 tensor, group 1 a 3 x 4 one of the same name; one client each, sending
# A (1 example) and B (3 examples)
A = f32([[1, 2, 3], [4, 5, 6]])
B = f32([[10, 20, 30, 40], [50, 60, 70, 80], [90, 100, 110, 120]])
TWO = {"groups.0.blocks.0.w": np.zeros((2, 3), np.float32),
       "groups.1.blocks.0.w": np.zeros((3, 4), np.float32)}
SENT = [ClientUpdate("0", {"groups.0.blocks.0.w": A}, 1),
        ClientUpdate("1", {"groups.1.blocks.0.w": B}, 3)]


def test_overlap_averages_the_leading_slice_by_examples():
    new = flexifed(TWO, "overlap").aggregate(SENT)
    # [:2, :3]: (1 * A + 3 * B[:2, :3]) / 4, e.g. (1 + 3 * 10) / 4 = 7.75; the rest B's own
    overlap = f32([[7.75, 15.5, 23.25], [38.5, 46.25, 54]])
    np.testing.assert_array_equal(new["groups.0.blocks.0.w"], overlap)
    np.testing.assert_array_equal(new["groups.1.blocks.0.w"],
                                  f32([[7.75, 15.5, 23.25, 40], [38.5, 46.25, 54, 80],
                                       [90, 100, 110, 120]]))
    assert new["groups.0.blocks.0.w"].dtype == np.float32


def test_strict_shares_nothing_across_widths_unchanged():
    new = flexifed(TWO, "strict").aggregate(SENT)  # each group its own client's tensor
    np.testing.assert_array_equal(new["groups.0.blocks.0.w"], A)
    np.testing.assert_array_equal(new["groups.1.blocks.0.w"], B)
    cfg = resolve_config({"preset": "smoke-groups", "method": "flexifed"})
    assert cfg.own.flexifed_aggregation == "strict"  # the default is FlexiFed's own paper


def test_overlap_nests_over_three_widths_and_keeps_unshared_names():
    # widths 1, 2, 3 with 1, 2, 3 examples: element 0 is held by all three groups,
    # element 1 by groups 1 and 2, element 2 by group 2 only
    state = {f"groups.{g}.head.b": np.zeros(g + 1, np.float32) for g in range(3)}
    state["groups.2.blocks.5.w"] = np.zeros(2, np.float32)  # a block only group 2 has
    sent = {"0": f32([6]), "1": f32([3, 10]), "2": f32([2, 5, 7])}
    updates = [ClientUpdate(c, {f"groups.{c}.head.b": v}, int(c) + 1) for c, v in sent.items()]
    updates[2].tensors["groups.2.blocks.5.w"] = f32([4, 8])
    new = flexifed(state, "overlap").aggregate(updates)
    # (1*6 + 2*3 + 3*2) / 6 = 3; (2*10 + 3*5) / 5 = 7; 7
    np.testing.assert_array_equal(new["groups.0.head.b"], [3])
    np.testing.assert_array_equal(new["groups.1.head.b"], [3, 7])
    np.testing.assert_array_equal(new["groups.2.head.b"], [3, 7, 7])
    np.testing.assert_array_equal(new["groups.2.blocks.5.w"], [4, 8])


def test_pieces_cut_each_dimension_at_the_other_groups_sizes():
    pieces = overlap_pieces({"groups.0.x": (2, 3), "groups.1.x": (3, 4), "groups.1.y": (5,)})
    assert [box for _, box in pieces["groups.0.x"]] == [(slice(0, 2), slice(0, 3))]
    assert [box for _, box in pieces["groups.1.x"]] == [
        (slice(0, 2), slice(0, 3)), (slice(0, 2), slice(3, 4)),
        (slice(2, 3), slice(0, 3)), (slice(2, 3), slice(3, 4))]
    assert pieces["groups.0.x"][0][0] == pieces["groups.1.x"][0][0]  # the shared key
    assert len({key for key, _ in pieces["groups.1.x"]}) == 4
    assert [box for _, box in pieces["groups.1.y"]] == [(slice(0, 5),)]


def test_overlap_needs_max_common():
    with pytest.raises(ConfigError, match="'flexifed-strategy' = 'basic-common' with "
                                          "'flexifed-aggregation' = 'overlap'"):
        resolve_config({"preset": "smoke-groups", "method": "flexifed",
                        "flexifed-aggregation": "overlap", "flexifed-strategy": "basic-common"})


def test_smoke_groups_overlap_differs_from_homo_while_strict_equals_it(tmp_path):
    """Two rounds of the smoke-groups preset (widths 16 / 32, depths 2 / 3, LoRA on both
    sublayers' last FC and the head): strict FlexiFed is Homo bit for bit; overlap shares the
    leading slices, each the example-weighted mean over every client holding it."""
    runs = {}
    for label, keys in (("homo", {"method": "homo"}), ("strict", {"method": "flexifed"}),
                        ("overlap", {"method": "flexifed", "flexifed-aggregation": "overlap"})):
        folder, _, replies, cfg = run_recording({"preset": "smoke-groups", **keys},
                                                tmp_path / label)
        runs[label] = (*results(folder), replies, cfg)
    homo, strict, overlap = (runs[k][1] for k in ("homo", "strict", "overlap"))
    assert set(homo) == set(strict) == set(overlap)
    assert all(np.array_equal(homo[n], strict[n]) for n in homo)
    assert [m["accuracy"] for m in runs["homo"][0]] == [m["accuracy"] for m in runs["strict"][0]]

    metrics, _, replies, _ = runs["overlap"]
    assert not any(m["rejected"] for m in metrics)
    last = replies[max(replies)]  # the final round's (tensors, examples) of the four clients
    assert len(last) == 4

    def mean_over(name, box, groups):
        held = [(t[f"groups.{g}.{name}"][box], k) for t, k in last for g in groups
                if f"groups.{g}.{name}" in t]
        assert len(held) == 2 * len(groups)  # two clients per group
        return zip(*held)

    every, small = (slice(None),), (slice(None), slice(0, 16))
    # the head's bias (10 in both): one value, the mean over all four clients
    np.testing.assert_array_equal(overlap["groups.0.head.bias"], overlap["groups.1.head.bias"])
    assert_rounded_mean(overlap["groups.0.head.bias"], *mean_over("head.bias", every, (0, 1)))
    # the head's weight (10 x 16 / 10 x 32): [:, :16] shared, [:, 16:] group 1's own
    assert_rounded_mean(overlap["groups.0.head.weight"], *mean_over("head.weight", small, (0, 1)))
    np.testing.assert_array_equal(overlap["groups.1.head.weight"][:, :16],
                                  overlap["groups.0.head.weight"])
    assert_rounded_mean(overlap["groups.1.head.weight"][:, 16:],
                        *mean_over("head.weight", (slice(None), slice(16, 32)), (1,)))
    # LoRA A of block 1's attn.proj (8 x 16 / 8 x 32): the common depth, leading columns
    lora = "blocks.1.attn.proj.lora_A.weight"
    assert_rounded_mean(overlap[f"groups.0.{lora}"], *mean_over(lora, small, (0, 1)))
    # block 2 exists in group 1 only: its own clients' mean
    lora2 = "blocks.2.mlp.fc2.lora_B.weight"
    assert_rounded_mean(overlap[f"groups.1.{lora2}"], *mean_over(lora2, every, (1,)))
    # and the run differs from Homo's: Homo keeps each group's head bias its own
    assert not np.array_equal(homo["groups.0.head.bias"], homo["groups.1.head.bias"])
    assert not np.allclose(overlap["groups.0.head.bias"], homo["groups.0.head.bias"])
