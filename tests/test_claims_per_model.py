"""The per-model table of HeteroTune's pooled Table 1 setting, on a hand-made store of two seeds
and two model groups.

Over two seeds x1, x2 the 95% interval is mean +- t(0.975, 1) |x1 - x2| / 2, with
t(0.975, 1) = tan(0.475 pi) = 12.7062: a spread of 10 gives +-63.53, of 7 +-44.47, of 6
+-38.12, of 3 +-19.06, of 2 +-12.71, of 1 +-6.35. The paper's gap (Table 1, CIFAR-10 Avg):
AllLarge 80.76 - AllSmall 62.25 = 18.51; its effects against Homo (66.14) over it: HeteroTune
6.01 / 18.51 = +0.32, AllLarge 14.62 / 18.51 = +0.79, AllSmall -3.89 / 18.51 = -0.21, pFedLoRA
3.59 / 18.51 = +0.19, FlexiFed -4.78 / 18.51 = -0.26.
"""

import math

import numpy as np
import pytest

from fedtune_app.apps.evaluation import pack_correct
from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.entries import Claim, Setting
from fedtune_app.claims.per_model import group_labels, group_points, per_model_section, planned_arms


def test_two_seed_interval_is_the_cauchy_quantile():
    """With one degree of freedom t is Cauchy: t(p, 1) = tan(pi (p - 1/2))."""
    assert math.tan(0.475 * math.pi) == pytest.approx(12.7062, abs=1e-4)
    assert cs.t_interval([0.0, 1.0]).half_width == pytest.approx(math.tan(0.475 * math.pi) / 2,
                                                                 rel=1e-9)


def _correct(right: int, of: int) -> str:
    return pack_correct(np.arange(of) < right)


def _record(groups: dict) -> dict:
    """A run whose last three evaluations are its primary metric's window. ``groups``: model
    group -> its accuracy (points) at each of the three, or one number for all three; 50 test
    examples in one stratum, so 2 points an example."""
    per_eval = {g: v if isinstance(v, list) else [v] * 3 for g, v in groups.items()}
    correct = [{str(g): {"all": _correct(round(v[i] / 2), 50)} for g, v in per_eval.items()}
               for i in range(3)]
    curve = [{"round": 2 * (i + 1), "accuracy": float(np.mean([v[i] for v in per_eval.values()]))
              / 100} for i in range(3)]
    return {"curve": curve, "test-correct": correct}


@pytest.fixture
def two_groups(monkeypatch):
    """Tier 't' with a pooled-like setting of two model groups (12x8, 24x48) and the paper's
    CIFAR-10 gap; seeds 0 and 1 for AllLarge, AllSmall, HeteroTune and Homo, and a seed 2 of
    HeteroTune that the tables of seeds 0-1 leave out."""
    monkeypatch.setitem(reg.SETTINGS, "t-pm", Setting("t-pm", "hand-made", {"t": {
        "model-groups": "vit_tiny_patch16_224",
        "model-group-args": "embed_dim=8,depth=12,num_heads=1;embed_dim=48,depth=24,num_heads=3"}},
        **reg.HETERO_CIFAR))
    heterotune_seed0 = _record({0: 0, 1: [68, 70, 72]})
    # its small group over two strata of 10 and 40 examples, all and none right: the mean over
    # strata (the headline's reading of domains) is 50, the pooled accuracy would be 20
    for evaluation in heterotune_seed0["test-correct"]:
        evaluation["0"] = {"x": _correct(10, 10), "y": _correct(0, 40)}
    for point, large in zip(heterotune_seed0["curve"], (68, 70, 72)):
        point["accuracy"] = (50 + large) / 200
    return {("t-pm", "all-large", 0): _record({1: 80}), ("t-pm", "all-large", 1): _record({1: 90}),
            ("t-pm", "all-small", 0): _record({0: 40}), ("t-pm", "all-small", 1): _record({0: 50}),
            ("t-pm", "heterotune", 0): heterotune_seed0,
            ("t-pm", "heterotune", 1): _record({0: 52, 1: 72}),
            ("t-pm", "heterotune", 2): _record({0: 0, 1: 0}),
            ("t-pm", "homo", 0): _record({0: 40, 1: 70}),
            ("t-pm", "homo", 1): _record({0: 40, 1: 76})}


def test_group_points_average_the_window_and_the_strata(two_groups):
    assert group_points(two_groups["t-pm", "heterotune", 0]) == pytest.approx({0: 50.0, 1: 70.0})
    assert group_points(two_groups["t-pm", "all-large", 1]) == {1: 90.0}  # its one model
    assert group_points({"curve": []}) == {}


def test_per_model_table_by_hand(two_groups):
    lines = per_model_section("t", two_groups, seeds=(0, 1), setting="t-pm")
    assert lines[0] == "### `t-pm` model size by model size, beside the paper's Table 1"
    # gap AllLarge - AllSmall: 80 - 40 and 90 - 50, 40 on both seeds
    assert "AllLarge - AllSmall (40.00 points over 2 seeds) beside the paper's over its own " \
           "(80.76 - 62.25 = 18.51)." in lines[2]
    assert "then the arms that take the mechanism apart" in lines[2]
    assert lines[4] == ("| arm | seeds | 12x8 | 24x48 | Avg | paper: smallest / largest / Avg | "
                        "rank here / in paper | vs Homo (points) | vs Homo / gap (paper) |")
    rows = lines[6:-1]
    assert rows[:8] == [
        # Avg 80, 90; against Homo's 55, 58: 25, 32 (28.5 +- 44.47), 28.5 / 40 = 0.71
        "| AllLarge: `all-large` | 2 | - | 85.00 ± 63.53 | 85.00 ± 63.53 | - / - / 80.76 | "
        "1 / 1 | 28.50 ± 44.47 | +0.71 (+0.79) |",
        # small 50, 52; large 70, 72; Avg 60, 62; against Homo 5, 4: 4.5 +- 6.35, 4.5 / 40
        "| HeteroTune: `heterotune` | 2 | 51.00 ± 12.71 | 71.00 ± 12.71 | 61.00 ± 12.71 | "
        "65.17 / 79.09 / 72.15 | 2 / 2 | 4.50 ± 6.35 | +0.11 (+0.32) |",
        "| pFedLoRA: `pfedlora-shared` | 0 | no records yet | - | - | 63.23 / 75.82 / 69.73 | "
        "- / 3 | - | - (+0.19) |",
        "| FedDF: `feddf-paper` | 0 | no records yet | - | - | 66.26 / 72.82 / 68.57 | - / 4 | - "
        "| - (+0.13) |",
        "| FedMD: `fedmd-whole` | 0 | no records yet | - | - | 64.66 / 73.02 / 67.86 | - / 5 | - "
        "| - (+0.09) |",
        # small 40, 40; large 70, 76; Avg 55, 58
        "| Homo-Training: `homo` | 2 | 40.00 ± 0.00 | 73.00 ± 38.12 | 56.50 ± 19.06 | "
        "60.64 / 74.29 / 66.14 | 3 / 6 | the reference | the reference |",
        # against Homo: -15, -8: -11.5 +- 44.47, -11.5 / 40 = -0.29
        "| AllSmall: `all-small` | 2 | 45.00 ± 63.53 | - | 45.00 ± 63.53 | - / - / 62.25 | "
        "4 / 7 | -11.50 ± 44.47 | -0.29 (-0.21) |",
        "| FlexiFed: `flexifed-overlap` | 0 | no records yet | - | - | 52.46 / 66.22 / 61.36 | "
        "- / 8 | - | - (-0.26) |"]
    # then the mechanism's arms: adapter-Homo has no paper number, Table 4's ablations their Avg
    # (w/o LW 69.57: 3.43 / 18.51 = +0.19)
    assert rows[8] == ("| adapter-Homo: `heterotune-within-group` | 0 | no records yet | - | - | "
                       "- | - / - | - | - (-) |")
    assert rows[9] == ("| w/o LW (Table 4): `heterotune-no-lw` | 0 | no records yet | - | - | "
                       "- / - / 69.57 | - / - | - | - (+0.19) |")
    assert len(rows) == 8 + 1 + len(reg.HETERO_T4_CIFAR10)


def test_other_seeds_read_no_records_yet(two_groups):
    lines = per_model_section("t", two_groups, seeds=range(200, 210), setting="t-pm")
    assert "over the seeds with a record, of 200-209" in lines[2]
    assert "(no common seed yet)" in lines[2]
    assert all("| 0 | no records yet |" in row for row in lines[6:-1])
    assert per_model_section("cpu", two_groups) == []  # the pooled setting runs on mini only


def test_four_groups_take_the_papers_model_names(monkeypatch):
    args = ";".join(f"embed_dim={w},depth={d}" for w, d in ((8, 12), (16, 12), (32, 12), (48, 24)))
    monkeypatch.setitem(reg.SETTINGS, "t-four", Setting("t-four", "hand-made", {"t": {
        "model-groups": "vit_tiny_patch16_224", "model-group-args": args}}))
    assert group_labels("t", "t-four") == ["ViT-T (12x8)", "ViT-S (12x16)", "ViT-B (12x32)",
                                           "ViT-L (24x48)"]


def test_the_papers_table_1_rows_are_in_its_ranking_and_the_pooled_claims_arms():
    """The issue's order: AllLarge, HeteroTune, pFedLoRA, FedDF, FedMD, Homo, AllSmall, FlexiFed;
    the claims' Table 1 differences are the rows' Avg against HeteroTune's."""
    rows = reg.HETERO_T1_CIFAR10
    assert [r[0] for r in rows.values()] == ["AllLarge", "HeteroTune", "pFedLoRA", "FedDF",
                                             "FedMD", "Homo-Training", "AllSmall", "FlexiFed"]
    assert [r[3] for r in rows.values()] == sorted((r[3] for r in rows.values()), reverse=True)
    for base, arm in reg.POOLED_COMPARATORS.items():
        claim = reg.CLAIMS[f"heterotune-pooled-t1-vs-{base}"]
        assert claim.terms[1][2] == arm
        assert claim.paper_difference == round(72.15 - rows[base][3], 2)


def test_a_setting_shows_only_the_arms_its_claims_run(two_groups, monkeypatch):
    """The partition check's setting runs HeteroTune and Homo (and the gate's AllLarge and
    AllSmall): its table has those four rows, in the paper's ranking, and no row of an arm that
    no claim runs there."""
    monkeypatch.setitem(reg.CLAIMS, "t-pm-vs-homo", Claim(
        "t-pm-vs-homo", "HeteroTune", "Table 1", "hand-made",
        ((1.0, "t-pm", "heterotune"), (-1.0, "t-pm", "homo")), "greater", 0.0, "", 6.01))
    assert planned_arms("t-pm") == {"all-large", "all-small", "heterotune", "homo"}
    lines = per_model_section("t", two_groups, seeds=(0, 1), setting="t-pm",
                              arms=planned_arms("t-pm"))
    assert [row.split("`")[1] for row in lines[6:-1]] == ["all-large", "heterotune", "homo",
                                                          "all-small"]
    assert "the arms that take the mechanism apart" not in lines[2]
