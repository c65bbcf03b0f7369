"""``fedtune claims``: the interval and verdict logic on hand-made per-seed numbers, the
stability rule and the findings, robustness, the pairing of methods by seed, the run cache, and
one tiny claim end to end.

Student-t quantiles with 2 degrees of freedom have a closed form, t(p, 2) = (2p - 1) /
sqrt(2 p (1 - p)), so the intervals over 3 seeds below are worked out by hand:
t(0.975, 2) = 0.95 / sqrt(0.04875) = 4.302653, t(0.8, 2) = 0.6 / sqrt(0.32) = 1.060660.
"""

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtune_app.claims import claim_text, cli, execution, planning, verdicts
from fedtune_app.claims import registry as reg
from fedtune_app.claims import report as reporting
from fedtune_app.claims import stats as cs
from fedtune_app.claims import store as run_store
from fedtune_app.claims.entries import Check, Claim, Setting
from fedtune_app.claims.registry import CLAIMS, SETTINGS, tiers_of
from fedtune_app.config import ConfigError

T975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T80 = 0.6 / math.sqrt(2 * 0.8 * 0.2)
HALF = T975 / math.sqrt(3)  # half-width of the 95% interval of 3 values with sample std 1


def test_t_quantiles_closed_form():
    assert T975 == pytest.approx(4.302653, abs=1e-6)
    assert T80 == pytest.approx(1.060660, abs=1e-6)


def test_interval_of_three_seeds():
    ci = cs.t_interval([1.0, 2.0, 3.0])  # mean 2, sample std 1
    assert (ci.mean, ci.std, ci.n) == (2.0, 1.0, 3)
    assert ci.low == pytest.approx(2 - HALF, rel=1e-9)
    assert ci.high == pytest.approx(2 + HALF, rel=1e-9)
    one = cs.t_interval([5.0])
    assert one.mean == 5.0 and math.isnan(one.low) and one.n == 1
    with pytest.raises(ValueError, match="finite"):
        cs.t_interval([1.0, float("nan")])


def _flat(value: float, rounds: int = 40, every: int = 4, tail: list | None = None) -> dict:
    """A hand-made record: evaluated every 4 rounds at ``value`` points (the last evaluations
    replaced by ``tail``), so its primary metric and window gain are read off by eye."""
    values = [value] * (rounds // every)
    if tail:
        values[-len(tail):] = tail
    curve = [{"round": every * (i + 1), "accuracy": v / 100} for i, v in enumerate(values)]
    return {"curve": curve, "final": curve[-1]["accuracy"], "seconds": 1.0,
            "rejected-replies": 0, "hash": f"h{value}-{tail}", "lr": None}


@pytest.fixture
def hand_tier(monkeypatch):
    """Tier 't' with one setting and two claims of three seeds each, on hand-made records."""
    monkeypatch.setitem(SETTINGS, "t-hand", Setting("t-hand", "hand-made", {"t": {}}))
    a = Claim("t-a", "FedRA", "Table 1", "FedRA beats InclusiveFL",
              ((1.0, "t-hand", "fedra"), (-1.0, "t-hand", "inclusivefl")), "greater", 0.0,
              "", 9.0)
    b = Claim("t-b", "FedRA", "Table 1", "FedRA beats AllSmall",
              ((1.0, "t-hand", "fedra"), (-1.0, "t-hand", "all-small")), "greater", 0.0,
              "", 2.0)
    monkeypatch.setattr(reg, "CLAIMS", {"t-a": a, "t-b": b})
    records = {}
    for s in range(3):
        records["t-hand", "fedra", s] = _flat(80.0 + s)
        records["t-hand", "inclusivefl", s] = _flat(70.0 + 2 * s)  # differences 10, 9, 8
        records["t-hand", "all-small", s] = _flat(79.0 - s)  # differences 1, 3, 5
        records["t-hand", "all-large", s] = _flat(90.0)
    return records


def _rows(records):
    return {r["claim"].id: r for r in verdicts.evaluate("t", records=records)}


def test_verdicts_with_holm_over_the_tier(hand_tier):
    # t-a: 10, 9, 8: mean 9, s 1, t = 9 sqrt(3), t^2 = 243: p = 1 - sqrt(243 / 245) = 0.0040900
    # t-b: 1, 3, 5: mean 3, s 2, t = 3 sqrt(3) / 2, t^2 = 6.75: p = 1 - sqrt(6.75 / 8.75)
    #      = 0.121690. Holm over the two: 2 x 0.00409 = 0.00818 (reproduced), then
    #      max(0.00818, 1 x 0.12169) = 0.12169 (inconclusive)
    rows = _rows(hand_tier)
    a, b = rows["t-a"]["verdict"], rows["t-b"]["verdict"]
    assert a.p == pytest.approx(1 - math.sqrt(243 / 245), rel=1e-9)
    assert a.p_holm == pytest.approx(2 * (1 - math.sqrt(243 / 245)), rel=1e-9)
    assert b.p_holm == pytest.approx(1 - math.sqrt(6.75 / 8.75), rel=1e-9)
    assert (a.verdict, b.verdict) == (cs.REPRODUCED, cs.INCONCLUSIVE)
    # the paper's +9.0 inside ours (9 ± 2.48): consistent; the gap AllLarge - AllSmall is
    # 11, 12, 13 (mean 12): ours 9 / 12 = +0.75
    assert claim_text.effect_text(rows["t-a"]) == (cs.CONSISTENT, "+0.75 (paper n/a)")
    # detectable with s = 1 over 3 seeds: 3.26 (the noncentral t; test_claims_stats checks it)
    assert rows["t-a"]["gaps"]["t-hand"][1] is True  # 12 - 2.48 = 9.52 > 3.26


def test_the_column_at_the_papers_rate_gives_the_difference_beside_the_verdict(hand_tier):
    """The lr-0.01 column: the size of the effect first (differences 10, 9, 8: mean 9, s 1,
    95% half-width t(0.975, 2) / sqrt(3) = 4.3027 / 1.7321 = 2.48), then the verdict."""
    rows = _rows(hand_tier)
    # InclusiveFL (70, 72, 74) below AllSmall (79, 78, 77): -9, -6, -3, mean -6, s 3,
    # 95% half-width 4.3027 x 3 / sqrt(3) = 7.45: a finding beside the verdict
    text = ("9.00 ± 2.48 (95%): **reproduced**; no better than the smallest model on every "
            "client: inclusivefl -6.00 ± 7.45 against AllSmall")
    assert claim_text.beside_text(rows["t-a"]) == text
    table = claim_text.verdict_rows(list(rows.values()), {"t-a": rows["t-a"]})
    assert table[0].endswith("| verdict | at lr 0.01: difference (CI), verdict | robustness |")
    # the same verdict and sign at 0.01: robust to the rate; the other checks not run
    assert table[2].endswith(f"| {text} | robust to the learning rate (+9.00 here, +9.00 at "
                             f"0.01); {reg.NOT_CHECKED} |")
    assert table[3].endswith(  # a claim with nothing at 0.01
        f"| - | the learning rate not checked (the papers' 0.01 not all in); {reg.NOT_CHECKED} |")
    # at 0.01 the difference turns: sensitive, with both numbers
    other = dict(hand_tier)
    for s in range(3):
        other["t-hand", "inclusivefl", s] = _flat(90.0 + 2 * s)  # differences -10, -11, -12
    at_paper = _rows(other)["t-a"]
    assert at_paper["verdict"].verdict == cs.REFUTED
    assert claim_text.robustness(rows["t-a"], at_paper) == (
        f"**sensitive to the learning rate** (reproduced -> refuted; +9.00 here, -11.00 at "
        f"0.01); {reg.NOT_CHECKED}")
    # the claim's section: each arm at 0.01 (FedRA 80, 81, 82: 81 ± 2.48; InclusiveFL 70, 72,
    # 74: s 2, 72 ± 4.97), then the same difference and verdict, and the command
    assert claim_text.claim_section(rows["t-a"], "t", {}, rows["t-a"])[-2] == (
        "- At the papers' 0.01 for every arm (3 of 3 seeds; `fedtune claims run t-a --tier t "
        f"--lr paper`): fedra 81.00 ± 2.48; inclusivefl 72.00 ± 4.97; difference {text}.")
    records = dict(hand_tier)
    for seed in range(3):  # no InclusiveFL run at all
        del records["t-hand", "inclusivefl", seed]
    missing = _rows(records)["t-a"]
    assert claim_text.beside_text(missing) == f"**{cs.NOT_RUN}**"  # no difference yet
    assert claim_text.paper_rate_text(missing) == (
        "- At the papers' 0.01: no records yet (`fedtune claims run t-a --tier t --lr paper`).")


def test_tier_summary_counts_verdicts_and_the_median_detectable(hand_tier):
    rows = verdicts.evaluate("t", records=hand_tier)
    text = reporting.tier_summary(rows, hand_tier)[0]
    assert text.startswith("Campaign: 1 inconclusive, 1 reproduced. ")
    # detectable scales with the std: t-a (s = 1) d, t-b (s = 2) 2d; their median 1.5 d
    d = cs.detectable(1.0, 3, "greater")
    assert d == pytest.approx(3.264, abs=1e-3)  # test_claims_stats checks it by power
    assert f"over the 2 claims with every seed in: {1.5 * d:.2f} points" in text
    assert "Slowest arm: " in text and ", 1 s a run on average" in text


def test_tier_summary_counts_the_runs_and_names_the_arms_over_the_time_target(hand_tier,
                                                                                monkeypatch):
    monkeypatch.setitem(reg.TIER_SEEDS, "t", 3)  # a tier with the cost targets
    for seed, (fedra, inclusivefl) in enumerate([(130, 150), (125, 140), (100, 160)]):
        hand_tier["t-hand", "fedra", seed]["cpu-seconds"] = fedra  # mean 118.3: within
        hand_tier["t-hand", "inclusivefl", seed]["cpu-seconds"] = inclusivefl  # mean 150
    text = reporting.tier_summary(verdicts.evaluate("t", records=hand_tier), hand_tier)[0]
    assert ("Slowest arm: inclusivefl in `t-hand`, 150 s a run on average (target at most "
            "120 s on one idle core): 5 of the 12 runs over it; arms over it on average: "
            "inclusivefl in `t-hand` 150 s.") in text


def test_no_verdict_before_every_seed_and_the_gate(hand_tier):
    records = dict(hand_tier)
    del records["t-hand", "inclusivefl", 2]
    rows = _rows(records)
    assert rows["t-a"]["verdict"].verdict == cs.RUNNING  # 2 of 3 seeds
    # the family is planned: t-a still counts, as p = 1, so t-b's p is doubled, not its own
    assert rows["t-b"]["verdict"].p_holm == pytest.approx(2 * (1 - math.sqrt(6.75 / 8.75)))
    assert math.isnan(rows["t-a"]["verdict"].p_holm) and "test_alone" not in rows["t-a"]
    # a rising arm: rounds 28-40 at 70, 74, 78, 78: gain 78 - 72 = 6 on every seed
    for s in range(3):
        records["t-hand", "inclusivefl", s] = _flat(70.0, tail=[70, 74, 78, 78])
    row = _rows(records)["t-a"]
    # the arm still rises, which withholds nothing: primaries 80 + s against 76.67, differences
    # 3.33, 4.33, 5.33 (mean 13/3, s 1): t^2 = 169 / 3, p = 1 - sqrt(169 / 175) = 0.017292;
    # Holm x 2 = 0.034584 < 0.05: reproduced at the primary metric. But the difference moves:
    # rounds 36-40 (the last 20% of 40) against 28-32: (2 + s) - (8 + s) = -6 on every seed;
    # the primary interval 4.33 ± 2.48 (low 1.85) moved down by 6 crosses 0: unstable
    assert row["verdict"].p_holm == pytest.approx(2 * (1 - math.sqrt(169 / 175)), rel=1e-9)
    assert row["trend"].mean == pytest.approx(-6.0) and "test_alone" not in row
    assert row["verdict"].verdict == cs.UNSTABLE
    assert row["verdict"].reason == (
        "reproduced at the primary metric, but the difference moved -6.00 points (95% CI -6.00 "
        "to -6.00) over the last window; moved by it, the interval (-4.15, 6.82) leaves the "
        "verdict's side")
    # read at single rounds 24-40: InclusiveFL 70, 70, 74, 78, 78 against FedRA 80 + s: the
    # differences 10 + s, 10 + s, 6 + s, 2 + s, 2 + s, each with s = 1 (± 2.48): all above 0
    assert [(r, ci.mean) for r, ci in row["by_round"]] == [
        (24, 11.0), (28, 11.0), (32, 7.0), (36, 3.0), (40, 3.0)]
    assert "the same side at every one" in claim_text.by_round_text(row)
    for s in range(3):  # it ends at 82: 80 + s - 82 = -2, -1, 0 at rounds 36 and 40 (-1 ± 2.48)
        records["t-hand", "inclusivefl", s] = _flat(70.0, tail=[70, 74, 82, 82])
    row = _rows(records)["t-a"]
    assert "across the boundary at some" in claim_text.by_round_text(row)
    assert "same side" not in claim_text.verdict_text(row)
    # AllLarge within the detectable difference of AllSmall: not discriminative
    records = dict(hand_tier)
    for s in range(3):
        records["t-hand", "all-large", s] = _flat(80.0)  # gap 1, 2, 3: low end 2 - 2.48 < 3.26
    row = _rows(records)["t-a"]
    assert row["verdict"].verdict == cs.NOT_DISCRIMINATIVE
    # no verdict, but the test still counts, and its difference is stable (flat curves)
    assert row["test_alone"] == cs.REPRODUCED
    assert ("the test alone: reproduced, on the same side at each of the last 5 evaluations"
            in claim_text.verdict_text(row))


def test_collapse_is_read_on_validation_and_below_allsmall_is_its_own_finding(hand_tier):
    """An arm that peaks and falls on the *test* curve is not called collapsed (the test set
    decides nothing); on its validation curves (the tuning runs at its rate) it is."""
    records = dict(hand_tier)
    # InclusiveFL peaks at 95 on the test curve and ends at 70 + 2s
    for s in range(3):
        records["t-hand", "inclusivefl", s] = _flat(70.0 + 2 * s, tail=[95] + [70 + 2 * s] * 5)
    claim = reg.CLAIMS["t-a"]
    row = verdicts.evaluate_claim(claim, "t", records)
    assert row["collapse"] == {}
    # validation curves: best 95 and 93, finals 70 and 72: -25 and -21, -23 on average
    falls = [_flat(70.0, tail=[95] + [70] * 5), _flat(72.0, tail=[93] + [72] * 5)]
    row = verdicts.evaluate_claim(claim, "t", records, None, {("t-hand", "inclusivefl"): falls})
    assert row["collapse"] == {"inclusivefl": pytest.approx(-23.0)}
    # 4 points under the best: no collapse
    dips = [_flat(70.0, tail=[74] + [70] * 5)] * 2
    assert verdicts.validation_collapse({("t-hand", "fedra"): dips}, "t-hand", "fedra") is None
    # below AllSmall: InclusiveFL's primaries 70 + 2s against 79 - s: -9, -6, -3
    assert row["below_small"]["inclusivefl"].mean == pytest.approx(-6.0)
    assert "fedra" not in row["below_small"]  # 1, 3, 5 above it
    text = claim_text.findings_text(row)
    assert text == (f"; {cs.COLLAPSED}: inclusivefl -23.00 points from its best; "
                    f"{cs.NO_BETTER_THAN_SMALL}: inclusivefl -6.00 ± 7.45 against AllSmall")


def test_a_setting_under_the_tiers_gap_target_flags_its_claims(hand_tier, monkeypatch):
    """On a tier with a fixed seed count, AllLarge - AllSmall (11, 12, 13: mean 12) under the
    15 points the tier was calibrated to reach flags the verdict, which stays the test's."""
    monkeypatch.setitem(reg.TIER_SEEDS, "t", 3)
    row = _rows(hand_tier)["t-a"]
    assert row["below_target"] == ["t-hand"] and row["verdict"].verdict == cs.REPRODUCED
    assert claim_text.verdict_text(row).endswith(f"; {verdicts.BELOW_TARGET}")
    gate = next(line for line in claim_text.claim_section(row, "t", {})
                if "Gate, discrimination" in line)
    assert gate.endswith("a mean of at least 15 points: **not met** in `t-hand`.")
    records = dict(hand_tier)
    for s in range(3):  # AllLarge 94: the gap 15, 16, 17 (mean 16) meets it
        records["t-hand", "all-large", s] = _flat(94.0)
    row = _rows(records)["t-a"]
    assert row["below_target"] == [] and verdicts.BELOW_TARGET not in claim_text.verdict_text(row)
    monkeypatch.delitem(reg.TIER_SEEDS, "t")  # a tier without the target: no flag at 12
    assert _rows(hand_tier)["t-a"]["below_target"] == []


def test_a_claim_equal_to_another_is_marked_and_counted_once(hand_tier, monkeypatch):
    """FlexiFed is Homo when the groups' widths differ: such a claim names the one it equals,
    the report checks their runs are the same, and Holm's family counts it once: the twin is
    decided at the other's adjusted p, so equal runs read the same verdict."""
    import dataclasses

    twin = dataclasses.replace(reg.CLAIMS["t-a"], id="t-twin", terms=(
        (1.0, "t-hand", "fedra"), (-1.0, "t-hand", "depthfl")), same_as="t-a",
        same_reason="hand-made")
    monkeypatch.setitem(reg.CLAIMS, "t-twin", twin)
    records = dict(hand_tier)
    for s in range(3):
        records["t-hand", "depthfl", s] = dict(records["t-hand", "inclusivefl", s])
    rows = _rows(records)
    assert rows["t-twin"]["identical"] is True and "runs identical" in claim_text.verdict_text(
        rows["t-twin"])
    # the family is still t-a and t-b: t-a's adjusted p is twice its own, not three times,
    # and the twin (differences 10, 9, 8 as t-a's) is reproduced at that same p
    holm_a = 2 * (1 - math.sqrt(243 / 245))
    assert rows["t-a"]["verdict"].p_holm == pytest.approx(holm_a, rel=1e-9)
    decided = rows["t-twin"]["verdict"]
    assert (decided.verdict, decided.p_holm) == (cs.REPRODUCED, rows["t-a"]["verdict"].p_holm)
    assert "same as t-a" in decided.reason
    records["t-hand", "depthfl", 1] = _flat(60.0)
    assert _rows(records)["t-twin"]["identical"] is False


def test_the_pooled_flexifed_claim_runs_the_overlap_reading_under_hashes_of_its_own():
    """The paper's design compares HeteroTune with FlexiFed as the paper ran it (overlapping
    slices), no longer with strict FlexiFed (Homo run for run). A record is found by its run
    config's hash: strict FlexiFed's keep theirs (the new key at its default is left out of the
    run key), and no hash of the overlap arm, at any rate and seed a claim or its tuning uses,
    is one of strict FlexiFed's, so no strict record counts for the overlap arm."""
    claim = CLAIMS["heterotune-pooled-t1-vs-flexifed"]
    assert claim.terms[1] == (-1.0, "heterotune-pooled", "flexifed-overlap")
    assert not claim.same_as and "overlapping slices" in claim.sentence
    assert CLAIMS["heterotune-t1-vs-flexifed"].same_as == "heterotune-t1-vs-homo"  # silo: strict
    overlap, strict, rates = set(), set(), {*reg.LR_GRID["mini"], reg.PAPER_LR}
    for lr in rates:
        for seed in range(10):
            keys = run_store.run_config("mini", "heterotune-pooled", "flexifed-overlap", seed, lr)
            plain = run_store.run_config("mini", "heterotune-pooled", "flexifed", seed, lr)
            assert run_store.run_key(keys) == run_store.run_key(plain) | {
                "flexifed-aggregation": "overlap"}
            overlap.add(run_store.config_hash(keys))
            strict.add(run_store.config_hash(plain))
        for seed in reg.TUNING_SEEDS:
            overlap.add(run_store.config_hash(run_store.tuning_config(
                "mini", "heterotune-pooled", "flexifed-overlap", seed, lr)))
            strict.add(run_store.config_hash(run_store.tuning_config(
                "mini", "heterotune-pooled", "flexifed", seed, lr)))
    assert len(overlap) == len(strict) == len(rates) * (10 + len(reg.TUNING_SEEDS))
    assert not overlap & strict


def test_every_cpu_record_keeps_its_config_hash():
    """The label-skew tier's committed records are found again: none of their run configs
    changed (a changed key would orphan a record and rerun it)."""
    records = planning.load_records("cpu")
    files = {p.name for p in (run_store.STORE / "runs" / "cpu").glob("*.json")}
    assert files and {r["file"] for r in records.values()} == files


def test_setting_table_row_shows_each_model_group_of_a_two_group_method():
    def rec(small, large, seconds):
        points = [{"round": r, "accuracy": (small + large) / 2, "accuracy-smallest": small,
                   "accuracy-largest": large} for r in (4, 8, 12, 16, 20)]
        return {"final": points[-1]["accuracy"], "curve": points, "seconds": seconds,
                "rejected-replies": 0, "lr": 0.03}

    # seeds: groups 0.6 / 0.2 and 0.7 / 0.3 -> headline 40 and 50; t(0.975, 1) = 12.706, the
    # half-width 12.706 * s / sqrt(2) with s = 10 / sqrt(2) for each column: 63.53. Flat
    # curves: the last-20% gain is 0 on both seeds (interval 0 ± 0, converged)
    row = claim_text.arm_row("homo", [rec(0.6, 0.2, 100), rec(0.7, 0.3, 300)])
    assert row == ("| homo | 2 | 45.00 ± 63.53 | 45.00 ± 63.53 (smallest model 65.00 ± 63.53, "
                   "largest 25.00 ± 63.53) | - | 0.00 ± 0.00 flat | +0.00 | 0.03 | 0 | 200 |")
    # one model on every client (AllLarge): both groups' figures are its own, nothing to add;
    # a record keeping its CPU seconds shows them beside the wall seconds
    assert claim_text.arm_row("all-large", [rec(0.9, 0.9, 10) | {"cpu-seconds": 8.4}]) == (
        "| all-large | 1 | 90.00 (n=1) | 90.00 (n=1) | - | 0.00 (n=1) | +0.00 | 0.03 | 0 | "
        "10 (CPU 8) |")


# ---------------------------------------------------------------- runs on the smoke preset

SMOKE_LR = 0.2  # conf/smoke.toml's rate (an untuned tier runs its preset's)
SMOKE = {"preset": "smoke", "num-server-rounds": 2, "screen-updates": False,
         "checkpoint-every": 0}


@pytest.fixture
def smoke_claim(monkeypatch):
    """A tiny claim on the smoke preset (random-init 4-block Mixer on UCI digits, 3 clients)."""
    monkeypatch.setitem(run_store.DEPTH, "smoke", 4)
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {"smoke": dict(SMOKE)}))
    claim = Claim("t-smoke-claim", "FedRA", "Table 1", "FedRA beats AllSmall",
                  ((1.0, "t-smoke", "fedra"), (-1.0, "t-smoke", "all-small")), "greater", 0.0,
                  "hand-made", 1.0, seeds=2)
    monkeypatch.setitem(CLAIMS, claim.id, claim)
    return claim


def test_a_campaign_with_a_missing_checkpoint_runs_nothing(tmp_path, monkeypatch, capsys,
                                                          smoke_claim):
    executed = []
    monkeypatch.setattr(execution, "execute", lambda spec, *a: executed.append(spec.name))
    missing = tmp_path / "none.safetensors"  # neither present nor one of pretrain's families
    with pytest.raises(ConfigError) as err:
        execution.run_claims([smoke_claim.id], "smoke", None, tmp_path / "store",
                             tmp_path / "results",
                      log=lambda t: None, extra={"model-source": str(missing)})
    assert str(err.value) == (f"claims: 6 runs to do, and their backbone checkpoints are "
                              f"missing: {missing}: no such checkpoint. Nothing was run.")
    assert executed == [] and not (tmp_path / "store").exists()
    # the dry run says so beside the runs it lists
    execution.print_dry_run(planning.plan_runs([smoke_claim.id], "smoke", store=tmp_path / "store",
                                  extra={"model-source": str(missing)}), store=tmp_path / "store")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 8 and all(line.startswith("todo t-smoke__") for line in out[:6])
    assert out[7] == ("missing backbone checkpoints (the campaign would stop on them): "
                      f"{missing}: no such checkpoint")


def test_rerun_older_runs_again_only_the_records_of_changed_code(tmp_path, monkeypatch, capsys,
                                                                   smoke_claim):
    store, executed = tmp_path / "store", []

    def fake_execute(spec, results, store, commit, fingerprint, rerun_older):
        executed.append((spec.arm, spec.seed, rerun_older))
        record = {"hash": spec.hash, "setting": spec.setting, "arm": spec.arm, "seed": spec.seed,
                  "fingerprint": fingerprint, "final": 0.5, "seconds": 1.0,
                  "rejected-replies": 0}
        (store / "runs" / "smoke").mkdir(parents=True, exist_ok=True)
        (store / "runs" / "smoke" / f"{spec.name}.json").write_text(json.dumps(record))
        return record

    monkeypatch.setattr(execution, "execute", fake_execute)
    monkeypatch.setattr(execution, "check_checkpoints", lambda specs: None)
    now = execution.code_fingerprints()
    monkeypatch.setattr(execution, "code_fingerprints", lambda: now)

    def campaign(**kw):
        executed.clear()
        execution.run_claims([smoke_claim.id], "smoke", None, store, tmp_path,
                             log=lambda t: None, **kw)
        return sorted(executed)

    assert len(campaign()) == 6  # all-large, all-small, fedra on seeds 0 and 1
    now = now | {"fedra": "a-fix-to-fedra"}  # FedRA's code changed, the gate arms' did not
    assert campaign() == []  # by hash: every record is kept
    execution.print_dry_run(planning.plan_runs([smoke_claim.id], "smoke", store=store), store=store)
    out = capsys.readouterr().out.splitlines()
    assert sorted(line.split("__")[0] for line in out if line.startswith("older")) == [
        "older t-smoke"] * 2 and sum(line.startswith("done") for line in out) == 4
    assert out[-1].endswith("; 2 done by older code, which `--rerun-older` runs again")
    assert campaign(rerun_older=True) == [("fedra", 0, True), ("fedra", 1, True)]
    assert campaign(rerun_older=True) == []  # the new records carry the code now


def test_execute_keeps_a_record_of_other_code_unless_told_to_rerun(tmp_path, monkeypatch,
                                                                    smoke_claim):
    from fedtune_app.apps import inprocess

    spec = planning.plan_runs([smoke_claim.id], "smoke", store=tmp_path)[0]
    folder = tmp_path / "runs" / "smoke"
    folder.mkdir(parents=True)
    # a run settings share, stored under another setting's name (and, by two campaigns that
    # started it at once, under a third's)
    first, twin = (folder / f"{name}__{spec.arm}__seed0__{spec.hash}.json"
                   for name in ("a-setting", "z-setting"))
    stored = {"hash": spec.hash, "arm": spec.arm, "fingerprint": "older"}
    first.write_text(json.dumps(stored))
    twin.write_text(json.dumps(stored | {"fingerprint": "older still"}))

    class Ran(Exception):
        pass

    def run_inprocess(keys):
        raise Ran

    monkeypatch.setattr(inprocess, "run_inprocess", run_inprocess)
    assert execution.execute(spec, tmp_path, tmp_path, "c", "now") == stored | {"reused": True}
    assert execution.execute(spec, tmp_path, tmp_path, "c", "older",
                             True) == stored | {"reused": True}
    with pytest.raises(Ran):
        execution.execute(spec, tmp_path, tmp_path, "c", "now", rerun_older=True)

    # the new record takes the first one's place and the twin goes: every reader sees it
    monkeypatch.setattr(inprocess, "run_inprocess", lambda keys: str(tmp_path / "out"))
    monkeypatch.setattr(execution, "summarize_run", lambda spec, folder, *a: {
        "hash": spec.hash, "arm": spec.arm, "fingerprint": "now"})
    execution.execute(spec, tmp_path, tmp_path, "c", "now", rerun_older=True)
    assert sorted(folder.iterdir()) == [first]
    assert run_store.find_cached(spec, tmp_path)["fingerprint"] == "now"
    assert run_store.records_by_hash(folder)[spec.hash]["fingerprint"] == "now"


def test_records_name_their_checkpoints_and_the_report_flags_a_setting_that_mixes_them(
        tmp_path):
    """A record names each checkpoint file it loaded by its sha256 (first 16 digits; sha256 of
    b"abc" is FIPS 180-2's example), model groups' files included and a shared file once; a
    campaign warns where this machine's files differ from those its stored records loaded, and
    the report lists the settings whose records loaded different files of one name."""
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools.pretrain import checkpoint_digests

    (tmp_path / "a.safetensors").write_bytes(b"abc")
    (tmp_path / "b.safetensors").write_bytes(b"")
    keys = {"method": "homo", "model-groups": "vit_tiny_patch16_224",
            "model-group-sources": f"{tmp_path}/a.safetensors;{tmp_path}/b.safetensors;"
                                   f"{tmp_path}/a.safetensors;random"}
    assert checkpoint_digests(resolve_config(keys)) == {"a.safetensors": "ba7816bf8f01cfea",
                                                        "b.safetensors": "e3b0c44298fc1c14"}
    assert checkpoint_digests(resolve_config({"model-source": "random"})) == {}

    # a campaign warns before it runs where this machine's file is not the one that the
    # setting's stored records loaded
    spec = run_store.RunSpec("mini", "s", "homo", 0, keys)
    assert execution.checkpoints_unlike_stored([spec], [
        {"setting": "s", "checkpoints": {"a.safetensors": "ba7816bf8f01cfea"}},
        {"setting": "t", "checkpoints": {"a.safetensors": "other"}}, {"setting": "t"}]) == []
    assert execution.checkpoints_unlike_stored([spec], [{"setting": "s"}] * 2) == [
        "setting s: 2 stored records name no checkpoint"]
    assert execution.checkpoints_unlike_stored([spec], [
        {"setting": "s", "checkpoints": {"a.safetensors": "ba7816bf8f01cfea",
                                         "b.safetensors": "other"}}]) == [
        "setting s: b.safetensors here is e3b0c44298fc1c14, its stored records loaded other"]

    def record(hash_, setting, digest=None):
        return {"hash": hash_, "setting": setting} | (
            {"checkpoints": {"a.safetensors": digest}} if digest else {})

    records = {r["hash"]: r for r in (record("1", "s", "x"), record("2", "s", "x"),
                                      record("3", "s", "y"), record("4", "t", "x"),
                                      record("5", "t"))}
    assert reporting.checkpoint_section("mini", records) == [
        "4 of the 5 records of tier `mini` name the backbone checkpoints they loaded (the others "
        "were made before records named them).",
        "- setting `s`: its records loaded 2 different `a.safetensors`: `x` (2 records); `y` "
        "(1 records)", ""]


def test_pairing_same_seed_same_partition_and_draws(tmp_path, monkeypatch):
    """One seed gives every method the same partitions, sampled clients and dynamic capacity
    draws, although FedRA draws its allocation from the same seed and InclusiveFL does not."""
    monkeypatch.setitem(run_store.DEPTH, "smoke", 4)
    keys = SMOKE | {"capacities": "4*4", "dynamic-capacities": True, "clients-per-round": 3,
                    "num-server-rounds": 3}
    monkeypatch.setitem(SETTINGS, "t-pair", Setting("t-pair", "smoke", {"smoke": keys}))
    from fedtune_app.apps.inprocess import run_inprocess

    def run(arm, seed):
        config = run_store.run_config("smoke", "t-pair", arm, seed)
        folder = run_inprocess(config | {"results-dir": str(tmp_path)})
        clients = json.load(open(f"{folder}/config.json"))["clients"]
        rounds = json.load(open(f"{folder}/allocation.json"))
        return config, ([(c["partition_id"], c["num_examples"], c["label_counts"])
                         for c in clients],
                        [(r["clients"], [sum(row) for row in r["matrix"]]) for r in rounds])

    fedra_cfg, fedra = run("fedra", 3)
    incl_cfg, inclusivefl = run("inclusivefl", 3)
    assert {k: v for k, v in fedra_cfg.items() if k != "method"} == \
        {k: v for k, v in incl_cfg.items() if k != "method"}
    assert fedra == inclusivefl  # partitions; per round: sampled clients, blocks held
    _, other_seed = run("fedra", 4)
    assert other_seed != fedra  # the comparison can fail: another seed draws otherwise


def test_a_tier_only_key_reaches_that_tier_and_that_arm_alone():
    """FedDF's distillation budget on the CPU tiers changes FedDF's runs there and nothing
    else."""
    cpu, mini, gpu = (run_store.run_config(t, "heterotune-groups", "feddf", 0, 0.01)
                      for t in ("cpu", "mini", "gpu"))
    assert cpu["feddf-distillation"] == mini["feddf-distillation"] == "epochs"
    assert "feddf-distillation" not in gpu
    assert (run_store.config_hash(cpu)
            != run_store.config_hash(cpu | {"feddf-distillation": "paper"}))
    for tier in ("cpu", "mini"):
        assert "feddf-distillation" not in run_store.run_config(tier, "heterotune-groups",
                                                                "fedmd", 0)


def test_group_ratio_settings_share_only_the_runs_that_ignore_the_ratio():
    """AllLarge / AllSmall put every client in one model group, so the two HeteroTune settings
    (groups 1:1 and 3:1) share their gate runs; HeteroTune itself splits the clients by the
    ratio, so its runs differ, and every share of the campaign picked by ``arms`` is a subset."""
    t1, t5 = "heterotune-groups", "heterotune-groups-small-heavy"
    for arm in ("all-large", "all-small"):
        assert run_store.config_hash(run_store.run_config("cpu", t1, arm, 0)) == \
            run_store.config_hash(run_store.run_config("cpu", t5, arm, 0))
    assert run_store.config_hash(run_store.run_config("cpu", t1, "heterotune", 0)) != \
        run_store.config_hash(run_store.run_config("cpu", t5, "heterotune", 0))
    ids = ["heterotune-t1-vs-homo", "heterotune-t5-small-heavy-vs-homo"]
    every = planning.plan_runs(ids, "cpu")
    # 3 seeds x (2 shared gate arms + HeteroTune and Homo in each of the 2 settings)
    assert len(every) == 3 * (2 + 2 * 2)
    gate = planning.plan_runs(ids, "cpu", arms=["all-large", "all-small"])
    assert [(s.arm, s.seed) for s in gate] == [(a, s) for s in range(3)
                                               for a in ("all-large", "all-small")]
    rest = planning.plan_runs(ids, "cpu", arms=["heterotune", "homo"])
    assert {s.hash for s in gate} | {s.hash for s in rest} == {s.hash for s in every}
    with pytest.raises(SystemExit, match="no arm 'homo2'"):
        planning.plan_runs(ids, "cpu", arms=["homo2"])


def test_a_glob_selects_the_claims_of_the_tier_and_an_id_without_it_is_an_error():
    """'heterotune-*' matches the GPU-only LLaMA rows too; on the CPU tier it runs the rest."""
    cpu_only = [c.id for c in CLAIMS.values() if c.id.startswith("heterotune-")
                and "cpu" in tiers_of(c)]
    gpu_only = [c.id for c in CLAIMS.values() if c.id.startswith("heterotune-")
                and "cpu" not in tiers_of(c)]
    assert cpu_only and gpu_only  # the glob below spans both kinds
    assert sorted(c.id for c in planning.match_claims(["heterotune-*"], "cpu")) == sorted(cpu_only)
    with pytest.raises(SystemExit, match=f"{gpu_only[0]}' matches no claim with a 'cpu' tier"):
        planning.match_claims([gpu_only[0]], "cpu")
    with pytest.raises(SystemExit, match="no claim matches 'nope-\\*'"):
        planning.match_claims(["nope-*"], "cpu")


def test_the_paper_tier_reads_each_data_set_from_its_own_folder():
    """NICO++ and DomainNet runs get their own ``data-dir``; one folder for both is refused."""
    specs = planning.plan_runs([], "paper", 1, data_dirs={"nico++": "/n", "domainnet": "/d"})
    by_data = {}
    for spec in specs:
        by_data.setdefault(spec.keys["dataset"], set()).add(spec.keys.get("data-dir"))
    assert by_data["nico++"] == {"/n"} and by_data["domainnet"] == {"/d"}
    assert by_data.keys() - {"nico++", "domainnet"} and all(
        v == {None} for k, v in by_data.items() if k not in ("nico++", "domainnet"))
    with pytest.raises(SystemExit, match="--data-dir domainnet=DIR --data-dir nico"):
        planning.plan_runs([], "paper", 1, extra={"data-dir": "/both"})
    with pytest.raises(SystemExit, match="expected DATASET=DIR"):
        planning.parse_data_dirs(["nico=/n"])
    assert planning.parse_data_dirs(["nico++=/a=b"]) == {"nico++": "/a=b"}


def test_the_gpu_tier_plans_in_a_fresh_process():
    """The GPU tier's presets set method-owned keys (DepthFL's headline): planning it must not
    depend on something else having registered the methods first."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fedtune_app.tools.cli", "claims", "run",
                           "--tier", "gpu", "--dry-run"], capture_output=True, text=True,
                          cwd=run_store.ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = [ln.split()[1] for ln in done.stdout.splitlines()
              if ln.startswith(("todo ", "done "))]
    assert listed == [s.name for s in planning.plan_runs([], "gpu")] and len(listed) > 100


@pytest.mark.parametrize("tier", ["cpu", "gpu"])
def test_every_claim_run_with_its_data_here_can_partition_its_clients(tier):
    """Every run a claim needs (each seed, each arm's held-out data) splits its training data
    over its clients with each client at least 'min-partition-size' examples; a Dirichlet(0.1)
    split that cannot (20 clients of BBC News) would only fail once the run has started."""
    from fedtune_app.data.scenarios import num_clients
    from fedtune_app.data.splits import client_examples, run_splits
    from fedtune_app.methods import resolve_config

    checked = set()
    for spec in planning.plan_runs([], tier):
        cfg = resolve_config(spec.keys | {"model-source": "random",
                                          "model-group-sources": "random"})
        key = (cfg.data, cfg.held_out, cfg.seed)
        if cfg.data.dataset != "bbc-news" or key in checked:
            continue  # the LLaMA rows' GLUE data is not on this machine
        checked.add(key)
        splits, clients = run_splits(cfg), num_clients(cfg)
        sizes = [len(client_examples(cfg, splits, i, clients).labels) for i in range(clients)]
        assert min(sizes) >= cfg.data.min_partition_size, (spec.name, sizes)
    assert len(checked) >= 3 * 2  # several seeds and held-out variants were partitioned


def test_tiny_claim_end_to_end_and_cache(tmp_path, monkeypatch, smoke_claim):
    store, results = tmp_path / "store", tmp_path / "results"
    executed = []
    real = execution.execute
    monkeypatch.setattr(execution, "execute", lambda spec, *a: executed.append(spec.name) or
                        real(spec, *a))
    heads = iter(f"commit{i}" for i in range(100))  # HEAD moves while the campaign runs
    monkeypatch.setattr(execution, "git_commit", lambda: next(heads))
    records = execution.run_claims([smoke_claim.id], "smoke", None, store, results,
                                   log=lambda t: None)
    # gate arms (all-large, all-small) and fedra, seeds 0 and 1: six runs, each stored once
    assert len(executed) == 6 and len(records) == 6
    assert {r["commit"] for r in records} == {"commit0"}  # the code the process loaded
    assert len(list((store / "runs" / "smoke").glob("*.json"))) == 6
    assert all(r["rejected-replies"] == 0 and r["rounds"] == 2 for r in records)
    assert all(r["cpu-seconds"] > 0 for r in records)  # one core's cost, beside the wall time
    # the machine whose rounding the record carries: torch's kernels and version of this process
    import torch

    assert {(r["machine"]["kernels"], r["machine"]["torch"]) for r in records} == {
        (torch.backends.cpu.get_cpu_capability(), torch.__version__)}

    executed.clear()  # unchanged keys: every run is found by its hash and reused
    again = execution.run_claims([smoke_claim.id], "smoke", None, store, results,
                                 log=lambda t: None)
    assert executed == [] and [r["hash"] for r in again] == [r["hash"] for r in records]

    # a bookkeeping key (how a run writes) keeps the hash; a key that changes training does not
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {
        "smoke": SMOKE | {"eval-batch-size": 17}}))
    execution.run_claims([smoke_claim.id], "smoke", 1, store, results, log=lambda t: None)
    assert executed == []
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {
        "smoke": SMOKE | {"lr": 0.1}}))
    execution.run_claims([smoke_claim.id], "smoke", 1, store, results, log=lambda t: None)
    assert len(executed) == 3  # seed 0 of all-large, all-small, fedra again
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {"smoke": SMOKE}))

    # the records: which test examples the last evaluations got right, and the code's
    # fingerprint; the primary metric is their mean, recomputed from the unpacked examples
    from fedtune_app.apps.evaluation import unpack_correct

    for r in records:
        assert r["fingerprint"] == execution.code_fingerprint(run_store.record_method(r))
        assert r["lr"] == SMOKE_LR
        windows = [[unpack_correct(v) for v in ev["0"].values()] for ev in r["test-correct"]]
        assert r["test-examples"] == sum(len(a) for a in windows[-1])
        # the smoke test set has no domains: one stratum, the headline its mean
        assert [w[0].mean() for w in windows] == pytest.approx(
            [p["accuracy"] for p in r["curve"][-len(windows):]], abs=1e-12)
    by_arm = {(r["arm"], r["seed"]): run_store.primary_points(r) for r in records}
    diffs = [by_arm["fedra", s] - by_arm["all-small", s] for s in (0, 1)]
    row = next(r for r in verdicts.evaluate("smoke", store) if r["claim"].id == smoke_claim.id)
    assert row["seeds"] == [0, 1] and row["differences"] == pytest.approx(diffs)
    # two rounds cannot show the difference's trend: no reproduced / refuted verdict stands
    assert row["trend"] is None
    assert row["verdict"].verdict not in (cs.REPRODUCED, cs.REFUTED)
    err, how = row["test_error"]
    assert math.isfinite(err) and how == "bootstrap over test examples"

    report = tmp_path / "claims.md"
    reporting.write_report(("smoke",), report, store, readme=None)
    text = report.read_text()
    assert f"`{smoke_claim.id}`" in text and f"**{row['verdict'].verdict}**" in text
    assert f"fedtune claims run {smoke_claim.id} --tier smoke" in text
    assert "was made by this checkout's code" in text
    # a record of older code is named by the report
    path = next((store / "runs" / "smoke").glob("t-smoke__fedra__seed1__*.json"))
    older = json.loads(path.read_text()) | {"fingerprint": "0123456789ab", "commit": "abc1234"}
    path.write_text(json.dumps(older))
    reporting.write_report(("smoke",), report, store, readme=None)
    text = report.read_text()
    assert f"commit `abc1234`, fingerprint `0123456789ab`: `{path.name}`" in text
    assert "`fedtune claims run --tier smoke --rerun-older` runs them again" in text
    assert (store / "smoke-t-smoke.png").stat().st_size > 1000


def test_a_run_stored_meanwhile_by_another_campaign_is_not_run_again(tmp_path, smoke_claim):
    """Two campaigns on one store (overlapping globs, or a share each): a run the other stored
    after this one planned comes back as stored, and nothing runs."""
    store, results = tmp_path / "store", tmp_path / "results"
    first = planning.plan_runs([smoke_claim.id], "smoke", 1, store)[0]
    other = {"final": 0.25, "seconds": 3.0, "rejected-replies": 0, "hash": first.hash}
    lines = []

    def other_campaign_stores_it(message):
        if not lines:  # the planning line: no run has started yet
            folder = store / first.folder / first.tier
            folder.mkdir(parents=True)
            (folder / f"{first.name}.json").write_text(json.dumps(other))
        lines.append(message)

    records = execution._run_specs([first], store, results, other_campaign_stores_it, "claims")
    assert records == [other]  # the stored record, without the marker
    assert not results.exists()  # no run started
    assert lines[1] == (f"claims: claims run 1/1 {first.setting} {first.arm} seed 0 lr "
                        f"{first.keys['lr']:g}: stored meanwhile by another campaign, "
                        "not run again")


def test_jobs_store_the_same_records_as_one_process(tmp_path, smoke_claim):
    """Two runs at a time, each in its own worker process: the same records as one process
    running them in turn (each run is seeded on its own), curves equal to the last digit."""
    one, two = tmp_path / "one", tmp_path / "two"
    quiet = lambda t: None  # noqa: E731
    alone = execution.run_claims([smoke_claim.id], "smoke", 1, one, tmp_path / "r1", log=quiet)
    lines = []
    shared = execution.run_claims([smoke_claim.id], "smoke", 1, two, tmp_path / "r2",
                           log=lines.append, jobs=2)
    # seed 0 of all-large, all-small and fedra
    assert lines[0] == "claims: 3 claims runs, 0 already done, 3 to run, 2 at a time"
    assert sorted(int(line.split()[3].split("/")[0]) for line in lines[1:]) == [1, 2, 3]
    assert [r["hash"] for r in shared] == [r["hash"] for r in alone]
    assert [r["curve"] for r in shared] == [r["curve"] for r in alone]
    assert [r["test-correct"] for r in shared] == [r["test-correct"] for r in alone]
    assert len(list((two / "runs" / "smoke").glob("*.json"))) == 3
    # each run writes its results into a folder of its own: runs of one method and seed (the
    # rates of a tuning) may start in the same second, when their stamped names would collide
    folders = [Path(r["results-folder"]) for r in shared]
    assert len({f.parent for f in folders}) == 3
    assert all(f.parent.name == f"{r['setting']}__{r['arm']}__seed{r['seed']}__{r['hash']}"
               for f, r in zip(folders, shared))


def test_jobs_workers_end_with_the_process_that_started_them(tmp_path):
    """A campaign killed by a signal runs no clean-up: its workers must not go on with the runs
    they were handed (minutes each, storing records nobody waits for)."""
    # a run handed out: it says which worker took it, then takes 600 s (only the exit ends it)
    (tmp_path / "handed_run.py").write_text(
        "import os, time\n"
        "def run(folder):\n"
        "    open(os.path.join(folder, str(os.getpid())), 'w').close()\n"
        "    time.sleep(600)\n")
    started = tmp_path / "started"
    started.mkdir()
    script = (
        f"import sys, time; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import handed_run\n"
        "from fedtune_app.claims.execution import worker_pool\n"
        "pool = worker_pool(2)\n"
        f"for _ in range(2): pool.submit(handed_run.run, {str(started)!r})\n"
        "time.sleep(900)\n")
    campaign = subprocess.Popen([sys.executable, "-c", script])
    try:
        # both runs under way (so each worker has started): a worker starved of CPU (the logic
        # tests run at the lowest priority beside Ray's start-ups) may take minutes to import torch
        deadline = time.monotonic() + 600
        while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
            assert campaign.poll() is None, "the campaign ended before its workers ran"
            time.sleep(0.2)
    finally:
        campaign.kill()  # SIGKILL: no handler, no executor shutdown, no atexit
        campaign.wait()
    workers = [int(f.name) for f in started.iterdir()]
    assert len(workers) == 2  # each run blocks its worker: the second went to the other one

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    # the runs take 600 s: only the exit can end them, and each worker's watch is running
    deadline = time.monotonic() + 120
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(running, workers))


def test_jobs_must_be_a_whole_number_of_at_least_one(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--tier", "mini", "--jobs", "0", "--dry-run"])
    assert "'0' is not a whole number of at least 1" in capsys.readouterr().err


# ---------------------------------------------------------------- the mini tier and its rates

def test_the_mini_tier_plans_every_claim_with_ten_seeds(tmp_path):
    mini = [c.id for c in CLAIMS.values() if "mini" in tiers_of(c)]
    # every claim of FedRA's and FedBRICK's tables and of HeteroTune's ViT tables (1 and 5),
    # (in the domain-silo variant and in the paper's design: 7 each), and the six of the
    # LoRA-rank papers' abstracts; in the paper's design also Table 1's headline taken apart
    # (2), Table 4's ablations (3) and the partition check (1)
    assert len(mini) == 26 + 7 + 6 + 6 and not any("-t3-" in i and "heterotune" in i
                                                   for i in mini)
    specs = planning.plan_runs([], "mini", lr_mode="paper")
    # distinct runs per seed, counted by hand from the registry: fedra-uneven 9 arms;
    # fedra-feature-label 4 (its own partition); mixed 10,10,6,6,4,4: AllSmall 4*6, FedRA,
    # InclusiveFL, Eq. 3 (AllLarge 12*6 shared); half 6*6: AllSmall, FedRA, InclusiveFL, Eq. 3;
    # third 4*6: FedRA, InclusiveFL (its AllSmall is mixed's); most 10*6: AllSmall, FedRA,
    # InclusiveFL; dynamic: FedRA, InclusiveFL (AllLarge and AllSmall ignore the draws: Table
    # 1's runs); FedBRICK uneven: FedBRICK, FedRA (AllSmall 4*6 shared);
    # severe half and third: FedBRICK each (FedRA shared with FedRA's 6*6 and 4*6); model
    # groups: 8 arms at 1:1:1, HeteroTune and Homo at 4:1:1 and at 1:1:4 (AllLarge and
    # AllSmall ignore the ratio): 9+4+4+4+2+3+2+2+1+1+8+2+2 = 44; LoRA ranks: mixed 8,8,4,4,2,2:
    # FedIT at rank 8 and at rank 2 (the gate), FedIT, FLoRA, FlexLoRA, HetLoRA; every client
    # at rank 8: FLoRA, FedEx-LoRA (its FedIT and gate are the mixed setting's): 6 + 2 = 8;
    # model groups in the paper's design: 8 arms at 3:3:2:2 plus adapter-Homo and Table 4's
    # three ablations, HeteroTune and Homo at 6:2:1:1 and at 1:1:2:6 (their gate: AllLarge and
    # AllSmall at 3:3:2:2), and the Dirichlet partition check's gate, HeteroTune and Homo:
    # 12 + 2 + 2 + 4 = 20
    assert len(specs) == (44 + 8 + 20) * 10
    assert {s.seed for s in specs} == set(range(10))
    one = next(s for s in specs if (s.setting, s.arm, s.seed) == ("fedra-uneven", "fedra", 3))
    assert {k: one.keys[k] for k in ("method", "seed", "capacities", "lr", "screen-updates",
                                     "proxy-for-all-methods")} == {
        "method": "fedra", "seed": 3, "capacities": "12,10,8,6,4,3", "lr": 0.01,
        "screen-updates": False, "proxy-for-all-methods": True}
    small = next(s for s in specs if (s.setting, s.arm, s.seed) == ("fedra-uneven", "all-small",
                                                                    0))
    assert small.keys["capacities"] == "3*6"  # every client on the smallest depth, 3 of 12
    pooled = [run_store.config_hash(run_store.run_config("mini", f"heterotune-pooled{s}",
                                                         "all-small", 0, 0.01))
              for s in ("", "-small-heavy")]
    silo = [run_store.config_hash(run_store.run_config("mini", f"heterotune-groups{s}",
                                                       "all-small", 0, 0.01))
            for s in ("", "-small-heavy")]
    assert pooled[0] != pooled[1] and silo[0] == silo[1]
    assert run_store.config_hash(run_store.run_config(
        "mini", "heterotune-pooled-small-heavy", "all-small-3322", 0, 0.01)) == pooled[0]
    # Table 4's AllSmall is Table 1's 3-block model, run for run (its draws are ignored)
    for arm in ("all-small", "all-large"):
        assert (run_store.run_config("mini", "fedra-dynamic", arm, 0, 0.01)
                == run_store.run_config("mini", "fedra-uneven", arm, 0, 0.01))
    assert run_store.run_config("mini", "fedra-dynamic", "all-small", 0,
                                0.01)["capacities"] == "3*6"
    fedra_dyn = next(s for s in specs if (s.setting, s.arm) == ("fedra-dynamic", "fedra"))
    assert fedra_dyn.keys["dynamic-capacities"] is True
    # tuned rates are the default: before any tuning run, planning says what to do first
    with pytest.raises(SystemExit, match="fedtune claims tune --tier mini"):
        planning.plan_runs([], "mini", store=tmp_path)
    # the committed tuning records choose a rate from the grid for every arm of every claim but
    # those of HeteroTune's pooled settings (recalibrated on 2026-12-07: tuned again from
    # scratch, 20 runs a seed)
    tuned = planning.plan_runs([i for i in mini if not i.startswith("heterotune-pooled")],
                               "mini")
    assert len(tuned) == len(specs) - 20 * 10
    assert {s.keys["lr"] for s in tuned} <= {0.003, 0.01, 0.03, 0.1}


def test_the_rank_settings_hold_every_block_and_share_their_gate():
    """The LoRA-rank claims: all 12 blocks on every client, the ranks as the setting or the gate
    arm says; FedIT at rank 8 (AllLarge), at rank 2 (AllSmall) and FedIT in the homogeneous
    setting are one run each, whichever setting asks."""
    def keys(setting, arm):
        return run_store.run_config("mini", setting, arm, 0, 0.01)

    mixed, same = "rank-mixed", "rank-homogeneous"
    assert {(keys(mixed, a)["method"], keys(mixed, a)["ranks"], keys(mixed, a)["capacities"])
            for a in ("flora", "fedit-r8", "fedit-r2")} == {
        ("flora", "8,8,4,4,2,2", "12*6"), ("fedit", "8*6", "12*6"), ("fedit", "2*6", "12*6")}
    for arm in ("fedit-r8", "fedit-r2"):
        assert run_store.config_hash(keys(mixed, arm)) == run_store.config_hash(keys(same, arm))
    assert run_store.config_hash(keys(same, "fedit")) == run_store.config_hash(keys(mixed,
                                                                                    "fedit-r8"))
    assert run_store.config_hash(keys(mixed, "flora")) != run_store.config_hash(keys(same, "flora"))
    # the gate's arms are the settings' reference and AllSmall
    assert [reg.claim_arms(CLAIMS["fedex-lora-vs-fedit"])[i] for i in (0, 1)] == [
        (same, "fedit-r8"), (same, "fedit-r2")]


def test_a_paper_difference_that_could_not_be_read_is_shown_so(hand_tier, monkeypatch):
    """A claim read from an abstract alone has no paper's difference: the tables say "not
    readable", no position against our interval and no ratio, instead of a number or +nan."""
    import dataclasses

    for missing in (None, math.nan):
        claim = dataclasses.replace(reg.CLAIMS["t-a"], paper_difference=missing)
        monkeypatch.setitem(reg.CLAIMS, "t-a", claim)
        row = _rows(hand_tier)["t-a"]
        # ours is still computed: differences 10, 9, 8 over a gap of 11, 12, 13
        assert row["verdict"].difference.mean == pytest.approx(9.0)
        assert claim_text.effect_text(row) == ("-", "+0.75 (paper n/a)")
        line = next(ln for ln in claim_text.verdict_rows([row]) if "`t-a`" in ln)
        assert line.startswith("| `t-a` | FedRA Table 1 | not readable | 9.00 ± 2.48 (95%) | - |")
        text = "\n".join(claim_text.claim_section(row, "t", {}))
        assert "(difference not readable)" in text and "the paper's not readable" in text
        assert "nan" not in line + text
    # a readable difference keeps its number and its position
    monkeypatch.setitem(reg.CLAIMS, "t-a", dataclasses.replace(claim, paper_difference=20.0))
    row = _rows(hand_tier)["t-a"]
    assert claim_text.effect_text(row)[0] == cs.OURS_SMALLER  # 20 above 9 + 2.48
    assert "| +20.00 |" in next(ln for ln in claim_text.verdict_rows([row]) if "`t-a`" in ln)


def test_rate_rule_highest_validation_mean_ties_to_the_smaller():
    assert planning.choose_rate({0.01: 61.0, 0.1: 70.5, 0.2: 70.5}) == 0.1  # a tie: the smaller
    assert planning.choose_rate({0.01: 61.0, 0.1: 70.504, 0.2: 70.496}) == 0.1  # equal to 0.01
    assert planning.choose_rate({0.01: 71.0, 0.1: 70.5}) == 0.01


def test_tuned_rates_from_fake_tuning_records(tmp_path, monkeypatch, smoke_claim):
    """Tuning runs stored as records; each arm's rate by the rule, the claim runs at it."""
    from fedtune_app.apps.results import write_json

    monkeypatch.setitem(reg.LR_GRID, "smoke", (0.01, 0.1, 0.2))
    # the smoke preset holds no validation set: tuning runs carve one, as the mini preset does
    monkeypatch.setattr(reg, "TUNING_KEYS", reg.TUNING_KEYS | {"validation-fraction": 0.2})
    (tmp_path / "tuning" / "smoke").mkdir(parents=True)
    specs = planning.plan_tuning([smoke_claim.id], "smoke")
    assert len(specs) == 3 * 3 * 2  # arms x rates x tuning seeds
    assert {s.seed for s in specs} == set(reg.TUNING_SEEDS)
    assert all(s.keys["evaluation-split"] == "validation" for s in specs)
    # validation curves (3 evaluations, primary = their mean = v): the peak at round 2
    value = {("fedra", 0.01): (60, 62), ("fedra", 0.1): (70, 71), ("fedra", 0.2): (70.5, 70.5),
             ("all-small", 0.01): (50, 50), ("all-small", 0.1): (40, 42),
             ("all-small", 0.2): (10, 10), ("all-large", 0.01): (80, 80),
             ("all-large", 0.1): (85, 85), ("all-large", 0.2): (84, 84)}
    for spec in specs:
        v = value[spec.arm, spec.keys["lr"]][spec.seed - reg.TUNING_SEEDS[0]]
        if (spec.arm, spec.keys["lr"], spec.seed) == ("all-large", 0.2, 1001):
            continue  # one tuning run missing: no choice for AllLarge yet
        curve = [{"round": r, "accuracy": a / 100} for r, a in ((1, v - 1), (2, v + 1), (3, v))]
        write_json(tmp_path / "tuning" / "smoke" / f"{spec.name}.json",
                   {"hash": spec.hash, "curve": curve, "final": v / 100})
    rates = planning.tuned_rates("smoke", tmp_path)
    fedra = rates["t-smoke", "fedra"]
    # means 61, 70.5, 70.5: the tie goes to 0.1
    assert fedra.lr == 0.1 and fedra.means == pytest.approx({0.01: 61, 0.1: 70.5, 0.2: 70.5})
    assert fedra.best_round == 2
    assert rates["t-smoke", "all-small"].lr == 0.01
    assert rates["t-smoke", "all-large"].lr is None  # 0.2 has one of two seeds
    assert rates["t-smoke", "all-large"].seeds == {0.01: 2, 0.1: 2, 0.2: 1}
    with pytest.raises(SystemExit, match="no learning rate chosen yet"):
        planning.plan_runs([smoke_claim.id], "smoke", store=tmp_path)
    runs = planning.plan_runs([smoke_claim.id], "smoke", store=tmp_path, arms=["fedra",
                                                                               "all-small"])
    assert {(s.arm, s.keys["lr"]) for s in runs} == {("fedra", 0.1), ("all-small", 0.01)}
    assert {(s.arm, s.keys["lr"]) for s in planning.plan_runs(
        [smoke_claim.id], "smoke", store=tmp_path, lr_mode="paper")} == {
        ("fedra", 0.01), ("all-small", 0.01), ("all-large", 0.01)}


def test_rule_v3_widens_an_edge_choice_one_rung_at_a_time(tmp_path, monkeypatch, smoke_claim):
    """An arm whose choice is its grid's largest (smallest) rate runs the next rung of the
    ladder on the tuning seeds, again while it stays the best, until the choice is inside its
    grid or the ladder ends (the edge's reason); the exploratory choice stays LR_GRID's."""
    from fedtune_app.apps.results import write_json

    monkeypatch.setitem(reg.LR_GRID, "smoke", (0.01, 0.1))
    monkeypatch.setitem(reg.LR_LADDER, "smoke", (0.001, 0.01, 0.1, 1.0))
    monkeypatch.setattr(reg, "TUNING_KEYS", reg.TUNING_KEYS | {"validation-fraction": 0.2})
    (tmp_path / "tuning" / "smoke").mkdir(parents=True)
    # validation mean per (arm, rate), both seeds alike; rejected replies at a diverged rung
    value = {("fedra", 0.01): 60, ("fedra", 0.1): 70, ("fedra", 1.0): 20,
             ("all-small", 0.01): 50, ("all-small", 0.1): 40, ("all-small", 0.001): 55,
             ("all-large", 0.01): 80, ("all-large", 0.1): 85, ("all-large", 1.0): 90}
    rejected = {("fedra", 1.0): 3}

    def store(specs):
        for spec in specs:
            v = value[spec.arm, spec.keys["lr"]]
            curve = [{"round": r, "accuracy": v / 100} for r in (1, 2, 3)]
            write_json(tmp_path / "tuning" / "smoke" / f"{spec.name}.json",
                       {"hash": spec.hash, "curve": curve, "final": v / 100,
                        "rejected-replies": rejected.get((spec.arm, spec.keys["lr"]), 0)})

    first = planning.plan_tuning([smoke_claim.id], "smoke", store=tmp_path)
    assert {(s.arm, s.keys["lr"]) for s in first} == {
        (a, lr) for a in ("fedra", "all-small", "all-large") for lr in (0.01, 0.1)}
    store(first)
    wider = planning.plan_tuning([smoke_claim.id], "smoke", store=tmp_path)
    new = {(s.arm, s.keys["lr"], s.seed) for s in wider} - {
        (s.arm, s.keys["lr"], s.seed) for s in first}
    # fedra and AllLarge chose 0.1 (the top): 1.0 next; AllSmall chose 0.01 (the bottom): 0.001
    assert new == {(a, lr, seed) for a, lr in (("fedra", 1.0), ("all-large", 1.0),
                                               ("all-small", 0.001)) for seed in (1000, 1001)}
    waiting = planning.tuned_rates("smoke", tmp_path, widened=True)
    assert waiting["t-smoke", "fedra"].lr is None
    assert waiting["t-smoke", "fedra"].next_rates == (1.0,)
    store(wider)
    again = planning.plan_tuning([smoke_claim.id], "smoke", store=tmp_path)
    assert {s.hash for s in again} == {s.hash for s in wider}  # all in: no rung more
    rates = planning.tuned_rates("smoke", tmp_path, widened=True)
    fedra, small, large = (rates["t-smoke", a] for a in ("fedra", "all-small", "all-large"))
    # fedra: 1.0 diverged (20 < 70): 0.1 is now inside its grid, the rung's rejections named
    assert (fedra.lr, fedra.grid, fedra.edge, fedra.rejected) == (0.1, (0.01, 0.1, 1.0), None,
                                                                   {1.0: 6})
    # AllSmall: 0.001 is better still and the ladder's bottom: an edge with its reason
    assert (small.lr, small.grid, small.edge) == (0.001, (0.001, 0.01, 0.1),
                                                  "the ladder ends at 0.001")
    assert (large.lr, large.edge) == (1.0, "the ladder ends at 1")
    assert large.means == pytest.approx({0.01: 80, 0.1: 85, 1.0: 90})
    # the exploratory seeds keep LR_GRID's choices; the confirmatory campaign takes the widened
    exploratory = planning.tuned_rates("smoke", tmp_path)
    assert {a: exploratory["t-smoke", a].lr for a in ("fedra", "all-small", "all-large")} == {
        "fedra": 0.1, "all-small": 0.01, "all-large": 0.1}
    assert planning.arm_rates("smoke", list(rates), store=tmp_path, widened=True) == {
        ("t-smoke", "fedra"): 0.1, ("t-smoke", "all-small"): 0.001,
        ("t-smoke", "all-large"): 1.0}


def test_tuning_runs_arm_by_arm_each_arms_rung_before_the_next_arm(tmp_path, monkeypatch,
                                                                    smoke_claim):
    """``tune_claims`` plans again after each arm: an arm's next rung runs before the next
    arm's grid, so a campaign cut short leaves whole choices, not a grid of every arm."""
    from fedtune_app.apps.results import write_json

    monkeypatch.setitem(reg.LR_GRID, "smoke", (0.01, 0.1))
    monkeypatch.setitem(reg.LR_LADDER, "smoke", (0.01, 0.1, 1.0))
    monkeypatch.setattr(reg, "TUNING_KEYS", reg.TUNING_KEYS | {"validation-fraction": 0.2})
    (tmp_path / "tuning" / "smoke").mkdir(parents=True)
    value = {0.01: 60, 0.1: 70, 1.0: 20}  # every arm: 0.1 at the grid's top, then 1.0 falls
    batches = []

    def store_runs(specs, store, *rest):
        batches.append({(s.arm, s.keys["lr"], s.seed) for s in specs})
        for spec in specs:
            v = value[spec.keys["lr"]]
            write_json(store / "tuning" / "smoke" / f"{spec.name}.json",
                       {"hash": spec.hash, "final": v / 100, "rejected-replies": 0,
                        "curve": [{"round": r, "accuracy": v / 100} for r in (1, 2, 3)]})

    monkeypatch.setattr(execution, "_run_specs", store_runs)
    rates = execution.tune_claims([smoke_claim.id], "smoke", store=tmp_path,
                                  results=tmp_path / "results", log=lambda *a: None)
    arms = [a for _, a in planning.tier_pairs([smoke_claim])]
    seeds = reg.TUNING_SEEDS
    assert batches == [batch for arm in arms for batch in (
        {(arm, lr, s) for lr in (0.01, 0.1) for s in seeds}, {(arm, 1.0, s) for s in seeds})]
    assert all(c.lr == 0.1 and c.grid == (0.01, 0.1, 1.0) for c in rates.values())
    assert json.loads((tmp_path / "tuning" / "smoke-rates.json").read_text())["rates"][
        f"t-smoke {arms[0]}"]["lr"] == 0.1
    # every arm stored: a second tuning passes them all over and runs nothing
    execution.tune_claims([smoke_claim.id], "smoke", store=tmp_path,
                          results=tmp_path / "results", log=lambda *a: None)
    assert len(batches) == 2 * len(arms)


def test_a_confirmatory_claim_waits_for_its_arms_widened_rates(tmp_path, monkeypatch,
                                                                smoke_claim):
    """While an arm's widened rate is not chosen, its claims wait (named, with the arm) and the
    confirmatory campaign plans the others; once chosen, the claim runs at the widened rate."""
    from fedtune_app.apps.results import write_json

    monkeypatch.setitem(reg.LR_GRID, "smoke", (0.01, 0.1))
    monkeypatch.setitem(reg.LR_LADDER, "smoke", (0.01, 0.1, 1.0))
    monkeypatch.setitem(reg.CONFIRMATORY_SEEDS, "smoke", (200, 201))
    monkeypatch.setattr(reg, "TUNING_KEYS", reg.TUNING_KEYS | {"validation-fraction": 0.2})
    (tmp_path / "tuning" / "smoke").mkdir(parents=True)
    value = {0.01: 50, 0.1: 60, 1.0: 10}  # every arm: 0.1 at the edge, then 1.0 diverges

    def store(specs):
        for spec in specs:
            v = value[spec.keys["lr"]]
            write_json(tmp_path / "tuning" / "smoke" / f"{spec.name}.json",
                       {"hash": spec.hash, "final": v / 100, "seconds": 360.0,
                        "setting": spec.setting, "arm": spec.arm,
                        "curve": [{"round": r, "accuracy": v / 100} for r in (1, 2, 3)]})

    store(planning.plan_tuning([smoke_claim.id], "smoke", store=tmp_path))
    assert planning.plan_runs([smoke_claim.id], "smoke", store=tmp_path, confirmatory=True) == []
    [line] = planning.confirmatory_left_out([smoke_claim], "smoke", tmp_path)
    # the claim's arms and its setting's gate arms
    assert line == ("t-smoke-claim: waits for the widened rate of all-large in t-smoke, "
                    "all-small in t-smoke, fedra in t-smoke (`fedtune claims tune`)")
    store(planning.plan_tuning([smoke_claim.id], "smoke", store=tmp_path))  # the 1.0 rung
    runs = planning.plan_runs([smoke_claim.id], "smoke", store=tmp_path, confirmatory=True)
    assert {(s.arm, s.seed, s.keys["lr"]) for s in runs} == {
        (a, seed, 0.1) for a in ("fedra", "all-small", "all-large") for seed in (200, 201)}
    assert planning.confirmatory_left_out([smoke_claim], "smoke", tmp_path) == []
    # the report prices them: six runs at their arm's 360 s of tuning = 0.6 core-hours
    (tmp_path / "runs" / "smoke").mkdir(parents=True)
    assert reporting.confirmatory_cost("smoke", tmp_path).startswith(
        " The confirmatory campaign (seeds 200-201, the claims whose arms have their rates): "
        "0 of 6 runs in, the rest about 0.6 core-hours (`fedtune claims run --tier smoke")


def test_tier_cost_counts_shared_runs_once_and_prices_the_rest(tmp_path, monkeypatch,
                                                              smoke_claim):
    monkeypatch.setitem(reg.TIER_SEEDS, "smoke", 2)  # a tier with a fixed seed count: 6 runs
    (tmp_path / "runs" / "smoke").mkdir(parents=True)
    (tmp_path / "tuning" / "smoke").mkdir(parents=True)
    stored = {"fedra": 4500.0, "all-large": 7200.0, "all-small": 1440.0}  # seed 0 of each
    records = {}
    for arm, cpu in stored.items():
        record = {"setting": "t-smoke", "arm": arm, "seconds": cpu + 99, "cpu-seconds": cpu,
                  "file": f"{arm}.json"}
        (tmp_path / "runs" / "smoke" / f"{arm}.json").write_text(json.dumps(record))
        records["t-smoke", arm, 0] = record
    # a second setting sharing AllLarge's run (the same file) does not count it twice
    records["t-other", "all-large", 0] = records["t-smoke", "all-large", 0]
    (tmp_path / "tuning" / "smoke" / "t.json").write_text(json.dumps(
        {"setting": "t-smoke", "arm": "fedra", "seconds": 2700.0}))  # no CPU seconds: wall
    text = reporting.tier_cost("smoke", records, tmp_path)[0]
    spent = (4500 + 7200 + 1440) / 3600
    # seed 1 of each arm at its mean: fedra (4500 + 2700) / 2 (its tuning run too), the others
    # their one run
    todo = ((4500 + 2700) / 2 + 7200 + 1440) / 3600
    assert text == (f"Cost (seeds 0-9): the 3 claim runs in took {spent:.1f} core-hours; the 3 "
                    f"still to do, about {todo:.1f} more at the stored seconds of the same "
                    "arm; target: all of them in about 12 core-hours. The tuning runs so far: "
                    "0.8 core-hours.")
    assert reporting.tier_cost("cpu", records, tmp_path) == []  # no fixed seed count, no budget


def test_dry_run_cost_from_the_stored_seconds_of_the_same_arm(tmp_path):
    runs = tmp_path / "runs" / "t"
    runs.mkdir(parents=True)
    stored = [("a", "fedra", {"seconds": 4000.0, "cpu-seconds": 3600.0}),
              ("a", "fedra", {"seconds": 8000.0, "cpu-seconds": 7200.0}),
              ("b", "all-small", {"seconds": 1800.0})]  # no CPU seconds: its wall seconds
    for i, (setting, arm, secs) in enumerate(stored):
        (runs / f"{setting}__{arm}__seed{i}__h{i}.json").write_text(
            json.dumps({"setting": setting, "arm": arm} | secs))
    done = run_store.RunSpec("t", "a", "fedra", 0, {"seed": 0})
    (runs / f"{done.name}.json").write_text(json.dumps({"setting": "a", "arm": "fedra",
                                                        "seconds": 1.0}))
    todo = [run_store.RunSpec("t", st, arm, 1, {"seed": i + 1}) for i, (st, arm) in enumerate(
        (("a", "fedra"), ("c", "fedra"), ("c", "all-small"), ("c", "depthfl")))]
    # fedra: mean CPU of its runs in 'a' (the finished one, 1 s, included): (3600 + 7200 + 1) / 3
    # twice (in 'a', and in 'c' from the tier's fedra runs); all-small 1800 s; depthfl unknown
    hours = (2 * (3600 + 7200 + 1) / 3 + 1800) / 3600
    assert run_store.estimate_cost([done] + todo, tmp_path) == (
        f"4 of 5 runs to do: about {hours:.1f} core-hours at the stored seconds of the same arm; "
        "1 runs of arms with no stored run not counted")


def test_a_robustness_check_judges_its_claims_on_its_own_runs_and_seeds(hand_tier, monkeypatch):
    """A check (e.g. the papers' 100 rounds) evaluates only its claims, on its seeds, Holm over
    them; the claim's robustness then reads it beside the learning rate's."""
    check = Check("more", "more rounds", {"num-server-rounds": 100}, ("t-a",), seeds=3)
    monkeypatch.setattr(reg, "CHECKS", {"more": check})
    rows = _rows(hand_tier)
    same = verdicts.evaluate("t", records=hand_tier, check=check)
    assert [r["claim"].id for r in same] == ["t-a"] and same[0]["need"] == 3
    # a family of one: Holm leaves its p as it is (1 - sqrt(243 / 245))
    assert same[0]["verdict"].p_holm == pytest.approx(1 - math.sqrt(243 / 245), rel=1e-9)
    text = claim_text.robustness(rows["t-a"], rows["t-a"], {"more": {"t-a": same[0]}})
    assert text == ("robust to the learning rate (+9.00 here, +9.00 at 0.01); robust to more "
                    f"rounds (+9.00 here, +9.00 with more rounds); {reg.NOT_CHECKED}")
    other = dict(hand_tier)
    for s in range(3):
        other["t-hand", "inclusivefl", s] = _flat(90.0 + 2 * s)  # differences -10, -11, -12
    turned = {"t-a": verdicts.evaluate("t", records=other, check=check)[0]}
    assert claim_text.robustness_word(rows["t-a"], rows["t-a"], {"more": turned}) == (
        "sensitive to more rounds; robust to lr")
    assert claim_text.robustness(rows["t-a"], rows["t-a"], {"more": {}}).startswith(
        "robust to the learning rate (+9.00 here, +9.00 at 0.01); more rounds not checked "
        "(3 seeds not all in)")
    # a claim the check does not name: only the learning rate
    assert "more rounds" not in claim_text.robustness(rows["t-b"], rows["t-b"], {"more": turned})


def test_the_rounds_check_plans_its_claims_with_its_keys_on_its_seeds():
    check = reg.CHECKS["rounds-100"]
    specs = planning.plan_runs(list(check.claims), "mini", check.seeds, extra=check.keys)
    assert {s.keys["num-server-rounds"] for s in specs} == {100}
    assert {s.seed for s in specs} == set(range(check.seeds))
    plain = planning.plan_runs(list(check.claims), "mini", check.seeds)
    # other runs than the tier's: their hashes differ, and the records are told apart by them
    assert not {s.hash for s in specs} & {s.hash for s in plain}
    spec = specs[0]
    assert run_store.hash_or_none("mini", spec.setting, spec.arm, spec.seed, spec.keys["lr"],
                                  extra=check.keys) == spec.hash
    with pytest.raises(SystemExit, match="--check rounds-100 names"):
        cli.main(["run", "fedra-t1-near-alllarge", "--check", "rounds-100", "--dry-run"])


def test_a_record_names_its_client_engine_and_the_engines_are_not_pooled(monkeypatch):
    """The batched engine matches the sequential one only up to float rounding: a run of each
    is its own record (its hash names the engine), and a tier's engine is part of every run's
    key. The sequential engine is the default, so a sequential run's key omits it and the
    committed records (none names an engine: every campaign ran the sequential one) keep their
    hashes; each reads as sequential."""
    keys = run_store.run_config("mini", "fedra-uneven", "fedra", 0, 0.1)
    assert "client-engine" not in keys
    assert (run_store.config_hash(keys | {"client-engine": "sequential"})
            == run_store.config_hash(keys))
    assert (run_store.config_hash(keys | {"client-engine": "batched"})
            != run_store.config_hash(keys))
    records = [json.loads(p.read_text()) for folder in ("runs", "tuning")
               for p in sorted((run_store.STORE / folder).glob("*/*.json"))]
    assert len(records) > 1000
    assert {run_store.record_engine(r) for r in records} == {"sequential"}
    assert run_store.record_engine({"client-engine": "batched", "run-key": {}}) == "batched"
    monkeypatch.setitem(run_store.CLIENT_ENGINE, "mini", "batched")
    batched = run_store.run_config("mini", "fedra-uneven", "fedra", 0, 0.1)
    assert batched["client-engine"] == "batched"
    assert run_store.config_hash(batched) == run_store.config_hash(keys | {"client-engine":
                                                                          "batched"})
    with pytest.raises(SystemExit, match="--set client-engine"):
        cli.main(["run", "fedra-t1-near-alllarge", "--set", 'client-engine="batched"',
                  "--dry-run"])


def test_a_claims_record_counts_the_client_rounds_each_engine_trained(tmp_path):
    """A record keeps the engine its run asked for and, from metrics.json, how many
    client-rounds each engine trained (two rounds of three clients, one client of round 2
    left to the sequential path: 1 and 5)."""
    from fedtune_app.claims import execution

    rounds = [{"round": r, "accuracy": 0.5, "loss": 1.0, "client-engines": engines}
              for r, engines in [(1, {"sequential": 0, "batched": 3}),
                                 (2, {"sequential": 1, "batched": 2})]]
    (tmp_path / "metrics.json").write_text(json.dumps(rounds))
    keys = run_store.run_config("mini", "fedra-uneven", "fedra", 0, 0.1)
    spec = run_store.RunSpec("mini", "fedra-uneven", "fedra", 0,
                             keys | {"client-engine": "batched"})
    record = execution.summarize_run(spec, tmp_path, 1.0, "abc", fingerprint="f")
    assert record["client-engine"] == "batched"
    assert record["client-engines"] == {"sequential": 1, "batched": 5}
    assert record["run-key"]["client-engine"] == "batched"


def test_claims_list_gives_each_setting_its_gate_on_the_committed_runs():
    listed = cli.list_settings("mini")
    settings = {st["id"]: st for st in listed if st["which"] == "exploratory"}
    assert set(settings) == {s.id for s in reg.SETTINGS.values() if "mini" in s.tiers}
    # each beside its rule-v3 gate on the confirmatory seeds: the pooled setting's AllLarge -
    # AllSmall over its ten, with its interval's lower end against the planned 2.56
    pooled = next(st for st in listed if st["id"] == "heterotune-pooled"
                  and st["which"] == "confirmatory")
    assert pooled["seeds"] == list(range(200, 210))
    assert pooled["status"] == ("passes" if pooled["gap"].low > 2.56 else "FAILS") + \
        " rule v3's gate (lower end above 2.56)"
    # FedIT rank 8 - rank 2 over the ten committed seeds (docs/claims/calibration-mini.md)
    rank = settings["rank-mixed"]
    assert rank["seeds"] == list(range(10)) and 3 < rank["gap"].mean < 5
    assert rank["status"] == "NOT discriminative by the 15-point target"
    assert settings["fedra-uneven"]["status"] == "discriminative"
    # and the validation split's gap over the tuning seeds, where the pooled setting was
    # calibrated to 15-25 points: AllLarge at 0.1 (77.95) - AllSmall at 0.03 (55.57), the
    # means the committed tuning/mini-rates.json holds
    validation = next(st for st in listed if st["id"] == "heterotune-pooled"
                      and st["which"] == "validation")
    rates = json.loads((run_store.STORE / "tuning" / "mini-rates.json").read_text())["rates"]
    large, small = rates["heterotune-pooled all-large"], rates["heterotune-pooled all-small"]
    assert (large["lr"], small["lr"]) == (0.1, 0.03)
    assert validation["value"] == pytest.approx(large["validation-means"]["0.1"]
                                                - small["validation-means"]["0.03"], abs=1e-9)
    assert 15 < validation["value"] < 25 and "(0.1, 0.03)" in validation["status"]
    dirichlet = [st for st in listed if st["id"] == "heterotune-pooled-dirichlet"]
    assert {st["which"]: st["status"] for st in dirichlet}["exploratory"] == \
        "none: its claims run on the confirmatory seeds only"


# ---------------------------------------------------------------- rule v3's declarations

def test_rule_v3_is_dated_and_its_confirmatory_seeds_are_fresh():
    """Rule v3 carries its date and reasons; its seeds are ten that no record made before it
    (claims, checks, tuning) used: every record on them finished on or after its date, no
    tuning record is on them, and the exploratory records stay on seeds 0-9."""
    assert reg.RULE_V3_DATE == "2026-12-07" and "after" in reg.RULE_V3_REASON
    assert [name for name, _ in reg.RULE_V3][:2] == ["seeds", "test-set error"]
    seeds = reg.CONFIRMATORY_SEEDS["mini"]
    assert seeds == tuple(range(200, 210))
    used = {p: int(p.name.split("__seed")[1].split("_")[0]) for folder in ("runs", "tuning")
            for p in (run_store.STORE / folder).rglob("*__seed*.json")}
    on_them = [p for p, seed in used.items() if seed in seeds]
    assert all(json.loads(p.read_text())["finished"] >= reg.RULE_V3_DATE for p in on_them)
    assert not any("tuning" in p.parts for p in on_them)
    assert {s for s in used.values() if s not in seeds} <= set(range(10)) | set(
        reg.TUNING_SEEDS)
    assert not set(seeds) & ({100} | set(reg.TUNING_SEEDS))  # the calibration and tuning seeds


def test_equivalence_claims_this_tier_cannot_show_are_labelled_and_left_out():
    """A margin of 1 point under the mini tier's smallest detectable margin (1.78): the three
    'similar' claims; FedRA's 'within 5 points' can be shown; a 'greater' claim has no margin."""
    mini = [c for c in CLAIMS.values() if "mini" in tiers_of(c)]
    labelled = sorted(c.id for c in mini if reg.cannot_show(c, "mini"))
    assert labelled == ["fedra-t5-half-eq3-similar", "fedra-t5-mixed-eq3-similar",
                        "fedra-t6-position-robust"]
    assert not reg.cannot_show(CLAIMS["fedra-t1-near-alllarge"], "mini")
    assert not reg.cannot_show(CLAIMS["fedra-t5-half-eq3-similar"], "cpu")  # no planning number
    left = planning.confirmatory_left_out(mini, "mini")
    assert sum("cannot show" in line for line in left) == 3
    kept = {c.id for c in planning.confirmatory_claims(mini, "mini")}
    # the pooled HeteroTune claims no longer wait for their setting's recalibration (done)
    assert not kept & set(labelled) and "heterotune-pooled-t1-vs-homo" in kept


def test_families_count_each_hypothesis_once_and_are_declared_before_their_runs():
    """The tier's family: every mini claim but the three it cannot show and the one whose runs
    are another's (FlexiFed = Homo in the domain silos): 45 - 3 - 1 = 41; the 0.01 check holds
    the same members, the 100-round check its own claims among them (all 11 are members)."""
    families = reg.v3_families("mini")
    assert set(families) == {"mini", "mini: lr 0.01", "mini: rounds-100"}
    assert len([c for c in CLAIMS.values() if "mini" in tiers_of(c)]) == 45
    assert len(families["mini"]) == 41 and families["mini: lr 0.01"] == families["mini"]
    assert "heterotune-t1-vs-flexifed" not in families["mini"]
    assert "heterotune-t1-vs-homo" in families["mini"]
    assert families["mini: rounds-100"] == reg.CHECKS["rounds-100"].claims
    assert reg.v3_families("cpu") == {}


def test_the_confirmatory_campaign_runs_the_readmes_findings_first_on_its_seeds(monkeypatch):
    # its order and seeds, whatever the widening of the rates has reached (no ladder: LR_GRID's)
    monkeypatch.setitem(reg.LR_LADDER, "mini", ())
    specs = planning.plan_runs([], "mini", confirmatory=True)
    assert {s.seed for s in specs} == set(reg.CONFIRMATORY_SEEDS["mini"])
    # the first block: FedRA against AllSmall in fedra-uneven, seed-major, gate arms first
    assert [(s.setting, s.arm, s.seed) for s in specs[:3]] == [
        ("fedra-uneven", "all-large", 200), ("fedra-uneven", "all-small", 200),
        ("fedra-uneven", "fedra", 200)]
    # a claim runs only once every arm of it has its rate: each planned run is at its arm's
    # choice (the pooled settings' arms join as their tuning comes in)
    rates = planning.tuned_rates("mini", pairs={(s.setting, s.arm) for s in specs},
                                 widened=True)
    assert all(rates[s.setting, s.arm].lr is not None
               and s.keys["lr"] == rates[s.setting, s.arm].lr for s in specs)
    # 'fedra-eq3' runs only for the claims this tier cannot show
    assert not any(s.arm == "fedra-eq3" for s in specs)
    with pytest.raises(SystemExit, match="no confirmatory seeds"):
        planning.plan_runs([], "cpu", confirmatory=True)


def test_the_dry_run_lists_the_confirmatory_campaign(capsys, monkeypatch):
    monkeypatch.setitem(reg.LR_LADDER, "mini", ())  # as above
    cli.main(["run", "fedra-t1-vs-allsmall", "fedra-t5-half-eq3-similar", "--tier", "mini",
              "--dry-run"])
    out = capsys.readouterr().out
    assert "confirmatory campaign of tier mini (rule v3 of 2026-12-07): seeds 200-209" in out
    assert "left out: fedra-t5-half-eq3-similar: margin 1 under" in out
    # fedra-t1-vs-allsmall: AllLarge, AllSmall and FedRA on ten seeds
    # whatever of them the committed confirmatory records already hold
    assert out.count("__seed20") == 30 and re.search(r"\d+ of 30 runs to do", out)
    assert "core-hours" in out


def test_on_the_committed_records_the_closed_form_leaves_no_word_to_the_bootstraps_seed():
    """Rule v3 reads every mini claim's test-set error in closed form (each statistic is a
    difference of headline accuracies on the same digits), so no replicate seed exists to move a
    word; on the committed records of FedRA against InclusiveFL the bootstrap agrees with it to
    its Monte Carlo error (four SDs of a SD from B = 1000 replicates, for two replicate seeds)."""
    claim = CLAIMS["fedra-t1-vs-inclusivefl"]
    records = planning.load_records("mini")
    seeds = [s for s in range(10) if all((st, a, s) in records for _, st, a in claim.terms)]
    assert len(seeds) == 10
    runs = [[(c, verdicts._unpacked(records[st, a, s])) for c, st, a in claim.terms]
            for s in seeds]
    n = len(next(iter(next(iter(runs[0][0][1][0].values())).values())))
    exact = cs.paired_test_se(runs, clustered=True)
    assert 0 < exact < 2  # points: a few tenths on 359 digits
    limit = exact * math.sqrt((n - 1) / n)  # the bootstrap's ideal value
    for seed in (0, 1):
        boot = cs.bootstrap_se(runs, 1000, seed, clustered=True)
        assert abs(boot - limit) < 4 * cs.bootstrap_mc_error(limit, 1000)


def test_mechanism_and_comparator_arms_hash_apart_from_the_old_records():
    from fedtune_app.claims.registry import CLAIMS, claim_arms
    from fedtune_app.claims.store import config_hash, run_config, run_key

    def hash_of(arm, setting="heterotune-pooled"):
        return config_hash(run_config("mini", setting, arm, 0, 0.01))

    # each strengthened comparator and each mechanism arm is its own run, not its base arm's
    pairs = [("fedmd-whole", "fedmd"), ("feddf-paper", "feddf"), ("pfedlora-shared", "pfedlora"),
             ("heterotune-within-group", "heterotune"), ("heterotune-no-lw", "heterotune"),
             ("heterotune-no-reg", "heterotune"), ("heterotune-no-lw-reg", "heterotune-no-lw")]
    for new, old in pairs:
        assert hash_of(new) != hash_of(old), new
    # the old arms keep the keys their records were made with: FedMD on adapters (the key's
    # default, left out of the hash), FedDF's one-pass stand-in
    assert "client-trains" not in run_key(run_config("mini", "heterotune-pooled", "fedmd", 0))
    assert run_key(run_config("mini", "heterotune-pooled", "feddf", 0))[
        "feddf-distillation"] == "epochs"
    # whole-model FedMD digests at its parties' own rate (FedMD's code: one Adam rate for the
    # digest and the revisit), so its chosen rate sets both; the adapter arm digests at 0.01
    assert {k: run_config("mini", "heterotune-pooled", "fedmd-whole", 0, 0.3)[k]
            for k in ("lr", "distill-lr")} == {"lr": 0.3, "distill-lr": 0.3}
    assert run_config("mini", "heterotune-pooled", "fedmd", 0, 0.3).get("distill-lr") is None
    # the pooled Table 1 claims run the strengthened arms; the decomposition adds up
    assert ("heterotune-pooled", "fedmd-whole") in claim_arms(
        CLAIMS["heterotune-pooled-t1-vs-fedmd"])
    sharing, adapters = (CLAIMS[f"heterotune-pooled-t1-{p}"] for p in ("sharing", "adapters"))
    total = {}
    for c, _, a in sharing.terms + adapters.terms:
        total[a] = total.get(a, 0.0) + c
    assert {a: c for a, c in total.items() if c} == {"heterotune": 1.0, "homo": -1.0}
    # the partition check: plain Dirichlet over 50 clients
    keys = run_config("mini", "heterotune-pooled-dirichlet", "heterotune", 0)
    assert (keys["partitioner"], keys["capacities"]) == ("dirichlet", "1*50")


def test_claims_registered_after_the_exploratory_campaign_stay_out_of_its_family():
    """The exploratory rule's Holm family is its 39 claims, FlexiFed-equals-Homo counted once:
    38 hypotheses, so its smallest p is multiplied by 38 (Holm's first step), whatever claims
    were registered after it without records."""
    rows = verdicts.evaluate("mini")
    ids = {r["claim"].id for r in rows}
    assert reg.AFTER_EXPLORATORY <= ids and len(ids) == 45
    family = [r for r in rows if not r["claim"].same_as
              and r["claim"].id not in reg.AFTER_EXPLORATORY]
    assert len(family) == 38
    first = min((r for r in family if r["tested"]), key=lambda r: r["verdict"].p)
    assert first["verdict"].p_holm == pytest.approx(min(1.0, 38 * first["verdict"].p),
                                                    rel=1e-12)


# ---------------------------------------------------------------- rule v3 on confirmatory seeds

@pytest.fixture
def v3_tier(hand_tier, monkeypatch):
    """The hand tier's two claims on confirmatory seeds 200-202 (the records of seeds 0-2
    moved there), the gate's planned detectable difference 3 points, a band of 2."""
    monkeypatch.setitem(reg.CONFIRMATORY_SEEDS, "t", (200, 201, 202))
    monkeypatch.setitem(reg.PLANNED_DETECTABLE, "t", 3.0)
    monkeypatch.setitem(reg.ROBUST_BAND, "t", 2.0)
    return {(st, a, 200 + s): r for (st, a, s), r in hand_tier.items()}


def _v3(records, paper_records=None):
    from fedtune_app.claims.verdicts_v3 import evaluate_v3

    return {r["claim"].id: r for r in evaluate_v3("t", records=records,
                                                  paper_records=paper_records)}


def test_rule_v3_reproduces_a_clear_difference_at_its_holm_p(v3_tier):
    # the exploratory hand tier's numbers, now on seeds 200-202 (no per-example results and no
    # test-set size on tier 't': the seeds' spread alone). t-a: 10, 9, 8, p = 1 - sqrt(243 /
    # 245) (t with 2 degrees of freedom: p = 1 - sqrt(t^2 / (t^2 + 2))); t-b: 1, 3, 5,
    # p = 1 - sqrt(6.75 / 8.75). Holm over the family of two: 2 x 0.00409 = 0.00818
    # (reproduced), max(0.00818, 0.12169) = 0.12169 (inconclusive)
    rows = _v3(v3_tier)
    a, b = rows["t-a"]["verdict"], rows["t-b"]["verdict"]
    assert reg.v3_families("t")["t"] == ("t-a", "t-b")
    assert a.p_holm == pytest.approx(2 * (1 - math.sqrt(243 / 245)), rel=1e-9)
    assert b.p_holm == pytest.approx(1 - math.sqrt(6.75 / 8.75), rel=1e-9)
    assert (a.verdict, b.verdict) == (cs.REPRODUCED, cs.INCONCLUSIVE)
    # 95% interval 9 +- t(0.975, 2) / sqrt(3), t(0.975, 2) = 0.95 sqrt(2 / 0.0975) = 4.30265
    assert a.difference.half_width == pytest.approx(0.95 * math.sqrt(2 / 0.0975) / math.sqrt(3))
    # the gate, stated once per setting: AllLarge - AllSmall 11, 12, 13, low end
    # 12 - 2.484 = 9.52 above the planned 3; the effect is 9 / 12 of the gap
    gap, passes, seeds = rows["t-a"]["gaps"]["t-hand"]
    assert passes is True and seeds == [200, 201, 202] and gap.mean == pytest.approx(12.0)
    assert claim_text.effect_text(rows["t-a"])[1] == "+0.75 (paper n/a)"
    assert rows["t-a"]["lr"] is None  # no runs at the papers' 0.01: no robustness word
    # the exploratory seeds 0-2 alone give rule v3 nothing
    assert {r["verdict"].verdict for r in _v3({k: r for k, r in v3_tier.items()
                                               if k[2] < 200}).values()} == {cs.NOT_RUN}


def test_rule_v3_withholds_a_family_with_a_member_missing(v3_tier):
    records = dict(v3_tier)
    del records["t-hand", "inclusivefl", 202]
    rows = _v3(records)
    # t-a: 2 of 3 seeds; t-b has all its seeds and its test, but no member counts as p = 1:
    # the family waits, and so does t-b's verdict
    assert rows["t-a"]["verdict"].verdict == cs.RUNNING
    b = rows["t-b"]["verdict"]
    assert b.verdict == "withheld" and math.isnan(b.p_holm)
    assert b.p == pytest.approx(1 - math.sqrt(6.75 / 8.75), rel=1e-9)
    assert b.reason == "family `t` waiting for 1 member"
    from fedtune_app.claims.verdicts_v3 import family_status

    assert family_status("t", list(rows.values())) == (
        "family `t`: 1 of 2 members in, Holm withheld, waiting for 1 member")


def test_rule_v3_gives_no_verdict_in_a_setting_that_fails_the_gate(v3_tier):
    records = dict(v3_tier)
    for s in (200, 201, 202):  # AllLarge - AllSmall 1, 2, 3: low end 2 - 2.48 < 3
        records["t-hand", "all-large", s] = _flat(80.0)
    rows = _v3(records)
    for claim in ("t-a", "t-b"):
        v = rows[claim]["verdict"]
        assert v.verdict == cs.NOT_DISCRIMINATIVE
        assert v.reason.startswith("AllLarge - AllSmall's lower end not above the planned "
                                   "detectable 3 points in t-hand")
    # the family is complete: the Holm p stays beside the missing verdict
    assert rows["t-a"]["verdict"].p_holm == pytest.approx(2 * (1 - math.sqrt(243 / 245)))
    # the report's gate table says so once for the setting: 2 +- t(0.975, 2) / sqrt(3) = 2.48
    # (tier 't' tunes no rates: no validation gap)
    from fedtune_app.claims.report import gate_table

    table = gate_table("t", run_store.STORE, list(rows.values()))
    assert "| `t-hand` | - | 2.00 ± 2.48 | 3 of 3 | **fails**: no verdict in it |" in table
    assert "| `t-hand` | - | 12.00 ± 2.48 | 3 of 3 | **passes** |" in gate_table(
        "t", run_store.STORE, list(_v3(v3_tier).values()))


def test_rule_v3_reads_unstable_when_the_difference_drifts_towards_the_null(v3_tier):
    records = dict(v3_tier)
    for i, s in enumerate((200, 201, 202)):  # InclusiveFL at rounds 28-40: 70 + 2i, 74, 78, 78
        records["t-hand", "inclusivefl", s] = _flat(70.0, tail=[70 + 2 * i, 74, 78, 78])
    row = _v3(records)["t-a"]
    # primary (rounds 32-40): 76.67 on every seed, differences 3.33, 4.33, 5.33: s 1,
    # t^2 = 169 / 3, p = 1 - sqrt(169 / 175), Holm x 2 = 0.0346: reproduced at the primary
    assert row["verdict"].p_holm == pytest.approx(2 * (1 - math.sqrt(169 / 175)), rel=1e-9)
    # the trend: rounds 36-40 (2 + i) minus rounds 28-32 (80 + i - (72 + i) = 8): -6, -5, -4,
    # mean -5, s 1, towards 0: t = 5 sqrt(3), one-sided p with 2 degrees of freedom
    # (1 - sqrt(t^2 / (t^2 + 2))) / 2 = (1 - sqrt(75 / 77)) / 2 = 0.00654 < 0.05
    p, trend, how = row["drift"]
    assert how == verdicts.TREND_SEEDS_ONLY  # hand-made records keep no per-example results
    assert p == pytest.approx((1 - math.sqrt(75 / 77)) / 2, rel=1e-9)
    assert trend.mean == pytest.approx(-5.0)
    assert trend.half_width == pytest.approx(0.95 * math.sqrt(2 / 0.0975) / math.sqrt(3))
    assert row["verdict"].verdict == cs.UNSTABLE
    assert row["verdict"].reason == (
        "reproduced at the primary metric, but the difference drifts -5.00 points (95% CI "
        "-7.48 to -2.52) over the last window, towards the null with p = 0.00654")
    for i, s in enumerate((200, 201, 202)):  # the same drift away from 0: said, not unstable
        records["t-hand", "inclusivefl", s] = _flat(70.0, tail=[74 - 2 * i, 70, 66, 66])
    row = _v3(records)["t-a"]
    # primary 67.33: differences 12.67 + i (s 1); the trend per seed: late 80 + i - 66 =
    # 14 + i, early 80 + i - (74 - 2i + 70) / 2 = 8 + 2i: 6 - i = 6, 5, 4, away from 0
    assert row["verdict"].verdict == cs.REPRODUCED
    assert row["verdict"].reason == ("the difference still drifts +5.00 points (95% CI +2.52 "
                                     "to +7.48) over the last window")


def test_rule_v3_robustness_word_from_the_paired_change_to_the_papers_rate(v3_tier):
    # at 0.01 FedRA is 3 points lower, by 3, 2.5, 3.5 on seeds 200-202, the other arms equal:
    # both claims change by -3, -2.5, -3.5 (mean -3, s 0.5, t^2 = 108): two-sided
    # p = 1 - sqrt(108 / 110), Holm over the check's two members: 2 x 0.00913 = 0.0183 < 0.05;
    # the words stay (t-a reproduced, t-b inconclusive at both rates): it shifts
    paper = dict(v3_tier)
    for i, (s, d) in enumerate(zip((200, 201, 202), (3.0, 2.5, 3.5))):
        paper["t-hand", "fedra", s] = _flat(80.0 + i - d)
    rows = _v3(v3_tier, paper)
    for claim in ("t-a", "t-b"):
        change, p_holm, word = rows[claim]["lr"]
        assert change.mean == pytest.approx(-3.0) and word == "shifts"
        assert p_holm == pytest.approx(2 * (1 - math.sqrt(108 / 110)), rel=1e-9)
    # one member without its 0.01 runs: the check's family waits, no word
    del paper["t-hand", "inclusivefl", 202]
    assert _v3(v3_tier, paper)["t-b"]["lr"][2] == "waiting for 1 member"


def test_rule_v3_intervals_hold_the_closed_form_test_set_error(v3_tier):
    from fedtune_app.apps.evaluation import pack_correct

    # one evaluation of 8 test examples per run: FedRA right on 6, InclusiveFL on 4 of them,
    # on every seed. Per example the claim's weighted difference over the three seeds (each
    # seed weighs 1/3) is u = 0, 0, 0, 0, 1, 1, 0, 0: mean 1/4, var (ddof 1) = 1.5 / 7, so
    # se^2 = var / 8 = 3 / 112 (x 100^2 in points); with the seeds' s^2 / n = 1 / 3 the 95%
    # half-width is t(0.975, 2) sqrt(1 / 3 + 30000 / 112)
    records = dict(v3_tier)
    for s in (200, 201, 202):
        for arm, right in (("fedra", 6), ("inclusivefl", 4)):
            correct = {"0": {"all": pack_correct([1] * right + [0] * (8 - right))}}
            records["t-hand", arm, s] = records["t-hand", arm, s] | {"test-correct": [correct]}
    row = _v3(records)["t-a"]
    assert row["test_error"] == (pytest.approx(100 * math.sqrt(3 / 112), rel=1e-12),
                                 "closed form over test examples")
    assert row["verdict"].difference.half_width == pytest.approx(
        0.95 * math.sqrt(2 / 0.0975) * math.sqrt(1 / 3 + 30000 / 112), rel=1e-9)


def _with_correct(record: dict, early: list, late: list) -> dict:
    """A hand-made record over 4 test examples: right on the examples ``early`` at every
    evaluation up to round 32 and on ``late`` at rounds 36 and 40, its curve to match; the
    per-example results as a record keeps them (rounds 32-40 in ``test-correct``, 28, the
    early window's other evaluation, in ``window-correct``)."""
    from fedtune_app.apps.evaluation import pack_correct

    def packed(right):
        return {"0": {"all": pack_correct([int(i in right) for i in range(4)])}}

    curve = [p | {"accuracy": len(late if p["round"] > 32 else early) / 4}
             for p in record["curve"]]
    return record | {"curve": curve, "test-correct": [packed(early), packed(late), packed(late)],
                     "window-correct": {"28": packed(early)}}


def test_rule_v3_drift_test_holds_the_trends_closed_form_test_set_error(v3_tier):
    # rounds 4-40: the trend's windows are rounds 28, 32 (early) and 36, 40 (late). Per seed,
    # FedRA's and InclusiveFL's examples right (early -> late), on 4 test examples:
    #   seed 200: FedRA {0, 1} -> {0, 1, 2}     InclusiveFL {0, 1} -> {0, 1}
    #   seed 201: FedRA {0, 1} -> {0, 1, 2, 3}  InclusiveFL {0, 1} -> {0, 1}
    #   seed 202: FedRA {0, 1} -> {0, 1}        InclusiveFL {0, 1} -> {1}
    # the trend of FedRA - InclusiveFL per example (late minus early), seed by seed:
    # (0, 0, 1, 0), (0, 0, 1, 1), (1, 0, 0, 0); over the seeds u = (1/3, 0, 2/3, 1/3): mean
    # 1/3, squared deviations 0 + 1/9 + 1/9 + 0, var (ddof 1) 2/27, se^2 = var / 4 = 1/54
    records = dict(v3_tier)
    for s, late in ((200, {0, 1, 2}), (201, {0, 1, 2, 3}), (202, {0, 1})):
        records["t-hand", "fedra", s] = _with_correct(records["t-hand", "fedra", s], {0, 1}, late)
    for s, late in ((200, {0, 1}), (201, {0, 1}), (202, {1})):
        records["t-hand", "inclusivefl", s] = _with_correct(records["t-hand", "inclusivefl", s],
                                                            {0, 1}, late)
    se, how = verdicts.trend_test_error(reg.CLAIMS["t-a"].terms, "t", records, [200, 201, 202],
                                        ([28, 32], [36, 40]))
    assert (se, how) == (pytest.approx(100 / math.sqrt(54), rel=1e-12),
                         "closed form over test examples")
    # the drift test: trends 25, 50, 25 points (100 x the rows above summed), mean 100 / 3,
    # s^2 / n = (625 / 3) / 3, plus se^2 = 10000 / 54: 6875 / 27 in all; the difference
    # (+) moving away from 0 has t = -(100 / 3) / sqrt(6875 / 27), t^2 = 48 / 11, and with 2
    # degrees of freedom P(T > t) = (1 + sqrt(t^2 / (t^2 + 2))) / 2 = (1 + sqrt(24 / 35)) / 2
    p, trend, how = _v3(records)["t-a"]["drift"]
    assert how == "closed form over test examples"
    assert trend.mean == pytest.approx(100 / 3)
    assert trend.half_width == pytest.approx(0.95 * math.sqrt(2 / 0.0975)
                                             * math.sqrt(6875 / 27), rel=1e-9)
    assert p == pytest.approx((1 + math.sqrt(24 / 35)) / 2, rel=1e-9)
    # one record made before records kept the early window: the seeds' spread alone, said so
    del records["t-hand", "inclusivefl", 202]["window-correct"]
    p, trend, how = _v3(records)["t-a"]["drift"]
    assert how == verdicts.TREND_SEEDS_ONLY
    assert trend.half_width == pytest.approx(0.95 * math.sqrt(2 / 0.0975)
                                             * math.sqrt(625 / 9), rel=1e-9)


def test_a_record_keeps_the_trend_windows_example_by_example(tmp_path):
    """A mini run (60 rounds evaluated every 5, six styles of 359 digits): the windows are
    rounds 40, 45 and 50-60; ``test-correct`` keeps 50-60 as before, ``window-correct`` 40 and
    45, and nothing else. What it adds to the file (``write_json``: indent 1): per evaluation,
    six lines of 4 spaces, the quoted style name (62 characters over the six), ': ', the quoted
    "359:" and 90 hex digits (45 bytes of bits; 96 characters), a line end, and a comma on five
    (685 characters), opened by '  "40": {' and '   "0": {' (10 each) and closed by '   }' and
    '  }' (5 and 4 with their line ends; a comma after the first round): 714 + 715; then the key
    ' "window-correct": {' and its line end (21), ' }' (2) and the comma and line end before it
    (2): 1,454 bytes, about 30% on the 4.7 kB of a stored mini record."""
    from fedtune_app.apps.evaluation import pack_correct
    from fedtune_app.data.sources import DIGIT_STYLES

    metrics = [{"round": r, "accuracy": 0.5, "loss": 1.0,
                "test-correct": {style: pack_correct([(i + r + k) % 3 == 0 for i in range(359)])
                                 for k, style in enumerate(DIGIT_STYLES)}}
               for r in range(5, 61, 5)]
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    keys = run_store.run_config("mini", "fedra-uneven", "fedra", 0, 0.1)
    record = execution.summarize_run(run_store.RunSpec("mini", "fedra-uneven", "fedra", 0, keys),
                                     tmp_path, 1.0, "abc", fingerprint="f")
    assert list(record["window-correct"]) == ["40", "45"]
    kept = verdicts.correct_by_round(record)
    assert sorted(kept) == [40, 45, 50, 55, 60]
    assert all(kept[m["round"]] == {"0": m["test-correct"]} for m in metrics
               if m["round"] in kept)
    without = {k: v for k, v in record.items() if k != "window-correct"}
    assert len(json.dumps(record, indent=1)) - len(json.dumps(without, indent=1)) == 1454


def test_the_headline_is_rule_v3s_once_a_claim_has_its_confirmatory_seeds(
        v3_tier, hand_tier, monkeypatch, tmp_path):
    # a third claim whose runs are t-a's: twice in the exploratory counts, once in rule v3's
    same = Claim("t-a2", "FedRA", "Table 1", "FedRA beats InclusiveFL (again)",
                 reg.CLAIMS["t-a"].terms, "greater", 0.0, "", 9.0, same_as="t-a")
    monkeypatch.setattr(reg, "CLAIMS", reg.CLAIMS | {"t-a2": same})
    monkeypatch.setattr(reporting, "confirmatory_line",
                        lambda tier, store, claims_in=0: "(where it stands)")
    exploratory = verdicts.evaluate("t", records=hand_tier)
    out = tmp_path / "claims.md"
    before = reporting.forest_section("t", tmp_path, out, exploratory, None, {})
    assert before == [
        "![t verdicts](t-forest.png)", "",
        "Tier `t`, **exploratory** (seeds 0-2, judged by the rule of 2026-11-28, written after "
        "most of their runs had been seen), 3 claims: 1 inconclusive, 2 reproduced; 0 of them "
        "sensitive to the learning rate (the papers' 0.01 against the tuned rates) or, where "
        "checked, to the papers' 100 rounds, by the exploratory rule's words; another backbone "
        "not checked yet. (where it stands) Each claim's numbers: the table and sections "
        "below.", ""]
    # no claim with its confirmatory seeds: the headline stays the exploratory one
    none_in = _v3({k: r for k, r in v3_tier.items() if k[2] == 200})
    assert reporting.forest_section("t", tmp_path, out, exploratory, None, {},
                                    list(none_in.values())) == before
    # every confirmatory seed in, the papers' 0.01 with FedRA 3 points lower (t-a and t-b
    # shift: test_rule_v3_robustness_word_from_the_paired_change_to_the_papers_rate)
    paper = dict(v3_tier)
    for i, (s, d) in enumerate(zip((200, 201, 202), (3.0, 2.5, 3.5))):
        paper["t-hand", "fedra", s] = _flat(80.0 + i - d)
    v3_rows = list(_v3(v3_tier, paper).values())
    lines = reporting.forest_section("t", tmp_path, out, exploratory, None, {}, v3_rows)
    assert lines == [
        "![t confirmatory verdicts](t-forest-confirmatory.png)", "",
        "Tier `t`, **confirmatory** (seeds 200-202, judged by rule v3 of 2026-12-07, written "
        "before any of their runs), 2 hypotheses (a claim whose runs are another's counted "
        "once), 2 of them with every confirmatory seed in: 1 inconclusive, 1 reproduced; at "
        "the papers' 0.01, on the paired change: 2 shifts; family `t`: all 2 members in, "
        "Holm-adjusted.", "",
        "Beside them, tier `t`, **exploratory** (seeds 0-2, judged by the rule of 2026-11-28, "
        "written after most of their runs had been seen), 3 claims: 1 inconclusive, 2 "
        "reproduced; 0 of them sensitive to the learning rate (the papers' 0.01 against the "
        "tuned rates) or, where checked, to the papers' 100 rounds, by the exploratory rule's "
        "words; another backbone not checked yet. Their figure: [t-forest.png](t-forest.png). "
        "Each claim's numbers: the tables and sections below.", ""]
    assert (tmp_path / "t-forest-confirmatory.png").stat().st_size > 1000
    # the README's block takes the same lines, its figures' paths from the README's folder
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{run_store.README_BEGIN}\nold\n{run_store.README_END}\nend\n")
    reporting.update_readme(readme, [line.replace("](t-", "](claims/t-") for line in lines])
    text = readme.read_text()
    assert "![t confirmatory verdicts](docs/claims/t-forest-confirmatory.png)" in text
    assert "Their figure: [t-forest.png](docs/claims/t-forest.png)." in text


def test_the_check_at_the_papers_rate_says_whether_it_ran_at_the_papers_step_count(
        monkeypatch):
    assert {c.paper for c in CLAIMS.values()} <= set(reg.PAPER_STEPS)
    # HeteroTune: 20 local epochs a round, no rounds stated; conf/mini-pooled.toml: 1 local
    # epoch a round for 40 rounds, so a round gets 1/20 of the paper's local epochs
    hetero = CLAIMS["heterotune-pooled-t1-vs-homo"]
    assert claim_text.step_count_text(hetero, "mini") == (
        "Step count: the paper 20 local epochs a round, its rounds not stated (HeteroTune Sec. "
        "4, Implementation Details: SGD at lr 0.01, batch 128, each client's local training "
        "rounds set to 20 (read as 20 local epochs)); here 1 local epoch a round for 40 "
        "rounds, so not the paper's step count: 0.01 gets 1/20 of the paper's local epochs a "
        "round.")
    # FedRA: 1 local epoch for 100 rounds; conf/mini.toml 1 for 60: 60 / 100 = 3/5
    fedra = CLAIMS["fedra-t1-vs-inclusivefl"]
    assert claim_text.step_count_text(fedra, "mini").endswith(
        "here 1 local epoch a round for 60 rounds, so not the paper's step count: 0.01 gets "
        "3/5 of the paper's local epochs.")
    assert claim_text.step_count_text(CLAIMS["flora-mixed-vs-fedit"], "mini") == (
        "Step count: the paper's not known (only its abstract could be read); here 1 local "
        "epoch a round for 60 rounds: whether 0.01 ran at the paper's step count cannot be "
        "said.")
    from fedtune_app.claims.entries import PaperSteps

    monkeypatch.setitem(reg.PAPER_STEPS, "FedRA", PaperSteps(1, 60, "a paper of 60 rounds"))
    assert claim_text.step_count_text(fedra, "mini").endswith(
        "so 0.01 ran at the paper's step count.")
    # the claim's line at the papers' 0.01 says it, with or without records
    row = {"claim": hetero, "tier": "mini", "seeds": []}
    assert claim_text.paper_rate_text(row) == (
        "- At the papers' 0.01: no records yet (`fedtune claims run heterotune-pooled-t1-vs-homo "
        "--tier mini --lr paper`). " + claim_text.step_count_text(hetero, "mini"))


def test_a_claim_taken_apart_shows_its_parts_beside_it_on_common_seeds(hand_tier, monkeypatch):
    """FedRA - AllSmall (differences 1, 3, 5) as FedRA - InclusiveFL (10, 9, 8) plus
    InclusiveFL - AllSmall (-9, -6, -3): seed by seed the parts add up, and each row's 95%
    interval is mean +- t(0.975, 2) std / sqrt(3) = mean +- 2.48414 std (tier 't' has no
    test-set error)."""
    c = Claim("t-c", "FedRA", "Table 1", "InclusiveFL beats AllSmall",
              ((1.0, "t-hand", "inclusivefl"), (-1.0, "t-hand", "all-small")), "greater", 0.0,
              "", None)
    monkeypatch.setattr(reg, "CLAIMS", reg.CLAIMS | {"t-c": c})
    monkeypatch.setattr(reg, "DECOMPOSITIONS", {"t-b": (("first", "t-a"), ("second", "t-c"))})
    lines = reporting.decomposition_section("t", hand_tier)
    assert lines[:2] == ["### `t-b` in parts", ""]
    assert lines[2] == ("FedRA beats AllSmall, taken apart on the seeds every arm has (3 of 10:"
                        " 0-9); the paper's difference is +2.00 points.")
    assert lines[6:9] == ["| the whole | `t-b` | +3.00 (-1.97 to +7.97) |",
                          "| first | `t-a` | +9.00 (+6.52 to +11.48) |",
                          "| second | `t-c` | -6.00 (-13.45 to +1.45) |"]
    # without records of every arm on two seeds or more: no numbers
    fewer = {k: v for k, v in hand_tier.items() if k[2] == 0}
    assert reporting.decomposition_section("t", fewer)[-2].endswith(
        "| not yet: fewer than 2 seeds that every arm has |")


def test_a_tier_with_confirmatory_seeds_takes_its_claims_apart_on_them(v3_tier, monkeypatch):
    """The decomposition reads the confirmatory seeds at their widened rates (where the claims
    it serves run), not the exploratory records the tier's other tables read: the hand
    numbers of the test above, moved to seeds 200-202, come out the same."""
    c = Claim("t-c", "FedRA", "Table 1", "InclusiveFL beats AllSmall",
              ((1.0, "t-hand", "inclusivefl"), (-1.0, "t-hand", "all-small")), "greater", 0.0,
              "", None)
    monkeypatch.setattr(reg, "CLAIMS", reg.CLAIMS | {"t-c": c})
    monkeypatch.setattr(reg, "DECOMPOSITIONS", {"t-b": (("first", "t-a"), ("second", "t-c"))})
    asked = []

    def load(tier, store, seeds, widened):
        asked.append((tier, tuple(seeds), widened))
        return v3_tier

    monkeypatch.setattr(reporting, "load_records", load)
    lines = reporting.mechanism_sections("t", Path("unused"), records={})
    assert asked == [("t", (200, 201, 202), True)]
    assert lines[2] == ("FedRA beats AllSmall, taken apart on the confirmatory seeds every arm "
                        "has (3 of 3: 200-202); the paper's difference is +2.00 points.")
    assert lines[6] == "| the whole | `t-b` | +3.00 (-1.97 to +7.97) |"


def test_the_confirmatory_line_tells_complete_seeds_from_complete_claims(monkeypatch):
    """No seed has every run of the campaign, yet two hypotheses have all ten seeds: the line
    says both and does not call the headline's counts unconfirmed."""
    monkeypatch.setattr(reporting, "confirmatory_seeds_in", lambda tier, store: 0)
    line = reporting.confirmatory_line("mini", Path("unused"), claims_in=2)
    assert line.startswith("**Confirmatory: 0 of 10 seeds complete**")
    assert "2 hypotheses have all their confirmatory seeds" in line
    assert "no count above is confirmatory" not in line
    assert "no count above is confirmatory" in reporting.confirmatory_line("mini", Path("x"))


def test_the_registered_decomposition_adds_up_to_its_whole():
    for whole, parts in reg.DECOMPOSITIONS.items():
        total: dict = {}
        for _, part in parts:
            for coefficient, setting, arm in reg.CLAIMS[part].terms:
                total[setting, arm] = total.get((setting, arm), 0.0) + coefficient
        assert {k: v for k, v in total.items() if v} == \
            {(st, a): c for c, st, a in reg.CLAIMS[whole].terms}


def test_the_rates_table_says_how_far_the_backbone_files_move_a_tuning_run(tmp_path):
    """The widened rungs ran on other stand-in files than the base grid: the report gives the
    range of the measured shift, and nothing while none was measured."""
    assert reporting.backbone_effect_text(tmp_path) == ""
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "backbone-effect.json").write_text(json.dumps({
        "s a lr 0.1": {"here-minus-stored": -1.36}, "s b lr 0.1": {"here-minus-stored": 1.33}}))
    text = reporting.backbone_effect_text(tmp_path)
    assert "2 base-grid arms moved by -1.36 to +1.33 points" in text
