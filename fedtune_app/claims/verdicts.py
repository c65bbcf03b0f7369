"""A claim's verdict from its records: the paired differences over seeds, the gate, the
test-set error, Holm over the tier."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.entries import Check, Claim
from fedtune_app.claims.planning import load_records, tier_pairs, tuned_rates
from fedtune_app.claims.registry import (
    SETTINGS,
    claim_seeds,
    claim_settings,
    tiers_of,
)
from fedtune_app.claims.store import (
    MAX_SEEDS,
    STORE,
    best_points,
    curve_points,
    final_points,
    hash_or_none,
    primary_points,
    records_by_hash,
)

# points: the mean AllLarge - AllSmall each setting of a tier with a fixed seed count was
# calibrated to reach (the papers' gap is about 50); a setting under it is named, not hidden
GAP_TARGET = 15.0
BELOW_TARGET = (f"setting not discriminative by the tier's {GAP_TARGET:g}-point AllLarge - "
                "AllSmall target")


def gap_terms(setting_id: str) -> tuple:
    """AllLarge - AllSmall of a setting as a claim's terms."""
    st = SETTINGS[setting_id]
    return ((1.0, setting_id, st.reference), (-1.0, setting_id, st.small))


def paired_differences(terms, records: dict, seeds) -> list[float]:
    """Per seed, the sum of ``coefficient x primary metric`` over the terms."""
    return [sum(c * primary_points(records[st, a, s]) for c, st, a in terms) for s in seeds]


def seeds_with(terms, records: dict, seeds) -> list[int]:
    """The seeds on which every term has its record."""
    return [s for s in seeds if all((st, a, s) in records for _, st, a in terms)]


def setting_gap(setting_id: str, records: dict) -> tuple[cs.Interval | None, list[int]]:
    """AllLarge - AllSmall (primary metric, paired over the seeds both have)."""
    seeds = seeds_with(gap_terms(setting_id), records, range(MAX_SEEDS))
    if not seeds:
        return None, []
    return cs.t_interval(paired_differences(gap_terms(setting_id), records, seeds)), seeds


def _label(claim: Claim, setting: str, arm: str) -> str:
    return f"{arm} ({setting})" if len(claim_settings(claim)) > 1 else arm


def _unpack(evaluation: dict) -> dict:
    from fedtune_app.apps.evaluation import unpack_correct

    return {g: {s: unpack_correct(v) for s, v in strata.items()}
            for g, strata in evaluation.items()}


def _unpacked(record: dict) -> list[dict]:
    return [_unpack(ev) for ev in record["test-correct"]]


def correct_by_round(record: dict) -> dict[int, dict]:
    """Round -> the per-example correctness (packed) of each evaluation a record keeps: the
    last ``LAST_EVALUATIONS`` (``test-correct``) and the trend windows' others
    (``window-correct``; records made before it have only the former)."""
    held = record.get("test-correct", [])
    rounds = [r for r, _ in curve_points(record)][-len(held):] if held else []
    return dict(zip(rounds, held)) | {int(r): ev for r, ev in
                                      record.get("window-correct", {}).items()}


def _resampled(tier: str) -> tuple[bool, str]:
    """(clustered, the resampling unit in words) of the tier's test set."""
    clustered = tier in reg.CLUSTERED_TEST
    return clustered, ("test digits, a digit's renderings resampled together" if clustered
                       else "test examples")


TREND_SEEDS_ONLY = ("seeds only: the records keep no per-example results of every evaluation "
                    "in the trend's two windows (made before records kept them)")


def trend_test_error(terms, tier: str, records: dict, seeds: list[int],
                     windows: tuple[list[int], list[int]]) -> tuple[float, str]:
    """(standard error in points, how) of the seed-mean of the trend of ``terms``' difference
    (``windows``: the (early, late) rounds of ``stats.trend_windows``). The mean over the late
    window minus the mean over the early one is linear in the per-example results, so
    ``stats.paired_test_se`` gives its error in closed form, each term's late evaluations at
    its coefficient and its early ones at minus it; (0, ``TREND_SEEDS_ONLY``) where a record
    lacks an evaluation of a window."""
    early, late = windows
    kept = {(st, a, s): correct_by_round(records[st, a, s]) for s in seeds for _, st, a in terms}
    if any(r not in by_round for by_round in kept.values() for r in early + late):
        return 0.0, TREND_SEEDS_ONLY
    runs = [[(sign * c, [_unpack(kept[st, a, s][r]) for r in window])
             for c, st, a in terms for sign, window in ((1, late), (-1, early))] for s in seeds]
    clustered, unit = _resampled(tier)
    return cs.paired_test_se(runs, clustered=clustered), f"closed form over {unit}"


def test_set_error(terms, tier: str, records: dict, seeds: list[int],
                   closed_form: bool = False) -> tuple:
    """(standard error in points, how) of the seed-mean of ``terms`` (a claim's): where every
    run recorded its per-example results, a bootstrap over test examples (``closed_form``: rule
    v3's exact value, ``stats.paired_test_se``), over digits with a digit's renderings together
    on the tiers whose domains render the same examples (``CLUSTERED_TEST``); else the binomial
    bound on the tier's test-set size, else NaN."""
    runs = [[(c, records[st, a, s]) for c, st, a in terms] for s in seeds]
    if all("test-correct" in r for seed_terms in runs for _, r in seed_terms):
        clustered, unit = _resampled(tier)
        unpacked = [[(c, _unpacked(r)) for c, r in seed_terms] for seed_terms in runs]
        if closed_form:
            return cs.paired_test_se(unpacked, clustered=clustered), f"closed form over {unit}"
        return cs.bootstrap_se(unpacked, clustered=clustered), f"bootstrap over {unit}"
    n = reg.TEST_EXAMPLES.get(tier)
    if n is None:
        return math.nan, ""
    means = [np.mean([primary_points(records[st, a, s]) for s in seeds]) / 100
             for _, st, a in terms]
    return (cs.binomial_se(means, [c for c, _, _ in terms], n),
            f"binomial bound on {n} test examples (these records keep no per-example results)")


READ_AT_ROUNDS = 5  # the last evaluations a claim's difference is also shown at, one by one


def difference_curves(claim: Claim, records: dict, seeds: list[int]
                      ) -> list[list[tuple[int, float]]]:
    """Per seed, the claim's paired difference at each round that every run of it evaluated."""
    curves = {(st, a, s): dict(curve_points(records[st, a, s]))
              for s in seeds for _, st, a in claim.terms}
    rounds = sorted(set.intersection(*(set(c) for c in curves.values())))
    return [[(r, sum(c * curves[st, a, s][r] for c, st, a in claim.terms)) for r in rounds]
            for s in seeds]


def differences_by_round(claim: Claim, records: dict, seeds: list[int],
                         last: int = READ_AT_ROUNDS) -> list[tuple[int, cs.Interval]]:
    """The claim's paired difference read at each of the last evaluated rounds that every run
    of it has, one evaluation each (not the primary metric's mean of three): whether the
    answer depends on the round it is read at."""
    curves = difference_curves(claim, records, seeds)
    return [(r, cs.t_interval([dict(c)[r] for c in curves], cs.interval_for(claim.direction)))
            for r, _ in curves[0][-last:]]


def validation_collapse(validation: dict, setting: str, arm: str) -> float | None:
    """An arm's drop from its best validation evaluation to its last, read on the tuning runs
    at its chosen rate (``validation``: (setting, arm) -> records), when it collapsed."""
    runs = validation.get((setting, arm))
    if not runs:
        return None
    return cs.collapsed_on_validation([final_points(r) for r in runs],
                                      [best_points(r) for r in runs])


def evaluate_claim(claim: Claim, tier: str, records: dict, rates: dict | None = None,
                   validation: dict | None = None, need: int | None = None) -> dict:
    """A claim's numbers and its verdict before Holm's adjustment (``evaluate`` adjusts and
    applies the stability rule); ``validation``: the arms' tuning records at their chosen rate,
    which alone say whether an arm collapsed; ``need``: its seeds (default: the tier's)."""
    need = need or claim_seeds(claim, tier)
    settings = claim_settings(claim)
    seeds = seeds_with(claim.terms, records, range(need))
    row = {"claim": claim, "tier": tier, "seeds": seeds, "need": need, "per_arm": {},
           "testable": False, "tested": False, "differences": [], "convergence": {}, "gaps": {},
           "collapse": {}, "below_small": {}, "below_target": []}
    if not seeds:
        row["verdict"] = cs.Verdict(cs.NOT_RUN)
        return row
    for _, st, a in claim.terms:
        rs = [records[st, a, s] for s in seeds]
        label = _label(claim, st, a)
        choice = (rates or {}).get((st, a))
        selected = None
        if choice is not None and choice.best_round is not None:
            at = [dict(curve_points(r)).get(choice.best_round) for r in rs]
            selected = (choice.best_round, float(np.mean(at))) if None not in at else None
        row["per_arm"][label] = {
            "primary": cs.t_interval([primary_points(r) for r in rs]),
            "final": cs.t_interval([final_points(r) for r in rs]),
            "selected": selected, "lr": rs[0].get("lr")}
        if (drop := validation_collapse(validation or {}, st, a)) is not None:
            row["collapse"][label] = drop
        small = [records.get((st, SETTINGS[st].small, s)) for s in seeds]
        if a != SETTINGS[st].small and None not in small:
            versus = cs.t_interval([primary_points(r) - primary_points(q)
                                    for r, q in zip(rs, small)])
            if cs.below_small(versus):
                row["below_small"][label] = versus
        try:  # a description of each arm, not a gate
            row["convergence"][label] = cs.arm_convergence([curve_points(r) for r in rs])
        except ValueError as e:  # too few evaluations for the two windows
            row["convergence"][label] = (False, str(e))
    diffs = paired_differences(claim.terms, records, seeds)
    test_error = test_set_error(claim.terms, tier, records, seeds)
    ci = cs.combined_interval(diffs, test_error[0], cs.interval_for(claim.direction))
    # the seeds' spread and the test set's error together, as one per-seed spread
    spread = math.hypot(ci.std, math.sqrt(ci.n) * ci.test_se) if ci.n > 1 else math.nan
    detect = cs.detectable(spread, need, claim.direction)
    row |= {"differences": diffs, "test_error": test_error,
            "by_round": differences_by_round(claim, records, seeds)}
    try:
        row["trend"] = cs.difference_trend(difference_curves(claim, records, seeds))
    except ValueError:  # too few evaluations for the two windows
        row["trend"] = None
    for st in settings:
        gap, gap_seeds = setting_gap(st, records)
        row["gaps"][st] = (gap, cs.discriminates(gap, detect) if gap else None, gap_seeds)
    row["below_target"] = [st for st, (gap, _, _) in row["gaps"].items()
                           if tier in reg.TIER_SEEDS and gap and gap.mean < GAP_TARGET]
    p = cs.p_value(diffs, claim.direction, claim.margin, test_error[0])
    verdict, reason = None, ""
    blind = [st for st, (_, ok, _) in row["gaps"].items() if ok is False]
    if len(seeds) < need:
        verdict, reason = cs.RUNNING, f"{len(seeds)} of {need} seeds"
    elif blind:
        verdict, reason = cs.NOT_DISCRIMINATIVE, (
            "AllLarge - AllSmall does not exceed the detectable difference in "
            + ", ".join(blind))
    elif any(ok is None for _, ok, _ in row["gaps"].values()):
        verdict, reason = cs.RUNNING, "AllLarge / AllSmall not all in"
    else:
        row["testable"] = True
        if claim.same_as:
            reason = f"same as {claim.same_as}: one hypothesis, counted once by Holm"
    # every claim with all its seeds is tested, gate passed or not; Holm's family leaves out
    # a claim equal to another
    row["tested"] = len(seeds) == need
    row["verdict"] = cs.Verdict(verdict or cs.INCONCLUSIVE, ci, p, math.nan, detect, reason)
    return row


def apply_stability(row: dict, decided: str) -> tuple[str, str]:
    """The registry's ``VERDICT_RULE``: a reproduced / refuted verdict whose difference is not
    stable reads unstable, with the reason."""
    c = row["claim"]
    if decided not in (cs.REPRODUCED, cs.REFUTED):
        return decided, ""
    if row.get("trend") is None:
        return cs.UNSTABLE, "too few evaluations to read the difference's trend"
    at_rounds = [ci for _, ci in row["by_round"][-reg.STABLE_AT_LAST:]]
    ok, why = cs.stable(decided, c.direction, c.margin, row["verdict"].difference, at_rounds,
                        row["trend"])
    return (decided, "") if ok else (cs.UNSTABLE, f"{decided} at the primary metric, but {why}")


def _identical(claim: Claim, records: dict, seeds: list[int]) -> bool | None:
    """For a claim marked ``same_as``: are its runs the other claim's, evaluation for
    evaluation, on every seed both have?"""
    other = reg.CLAIMS[claim.same_as]
    mine = [(st, a) for _, st, a in claim.terms]
    theirs = [(st, a) for _, st, a in other.terms]
    pairs = [(m, t) for m, t in zip(mine, theirs) if m != t]
    if not seeds or any((*p, s) not in records for m, t in pairs for p in (m, t) for s in seeds):
        return None
    return all(records[(*m, s)]["curve"] == records[(*t, s)]["curve"]
               for m, t in pairs for s in seeds)


def validation_records(tier: str, store: Path, pairs, rates: dict) -> dict:
    """(setting, arm) -> its tuning records (validation split) at its chosen rate."""
    by_hash = records_by_hash(store / "tuning" / tier)
    out = {}
    for st, a in pairs:
        choice = rates.get((st, a))
        if choice is not None and choice.lr is not None:
            out[st, a] = [by_hash[h] for seed in reg.TUNING_SEEDS
                          if (h := hash_or_none(tier, st, a, seed, choice.lr, tuning=True))
                          in by_hash]
    return out


def evaluate(tier: str = "cpu", store: Path = STORE, records: dict | None = None,
             lr_mode: str = "tuned", check: Check | None = None) -> list[dict]:
    """One row per claim of the tier with its verdict by the exploratory rule. Holm's family is
    every claim the tier plans (duplicates counted once) but those registered after the
    exploratory campaign (``reg.AFTER_EXPLORATORY``, a family of their own): a claim without
    all its seeds counts as p = 1 (rule v3 withholds such a family instead:
    ``stats.family_holm``), so an adjusted p never shrinks because other claims have not run
    yet.
    A claim whose gate fails keeps its adjusted p and what its test alone says
    (``row["test_alone"]``), but no verdict; a decided claim whose difference still moves
    reads unstable (``apply_stability``). ``check``: a robustness check's claims, on its runs
    and seeds, Holm over them."""
    if records is None:
        records = load_records(tier, store, lr_mode, check and check.keys)
    claims = ([reg.CLAIMS[i] for i in check.claims] if check else
              [c for c in reg.CLAIMS.values() if tier in tiers_of(c)])
    rates = tuned_rates(tier, store, tier_pairs(claims)) if tier in reg.LR_GRID else {}
    validation = validation_records(tier, store, tier_pairs(claims), rates)
    rows = [evaluate_claim(c, tier, records, rates, validation, check and check.seeds)
            for c in claims]
    adjusted = {}
    for later in (False, True):  # the exploratory campaign's family, then the claims after it
        adjusted |= cs.holm({r["claim"].id: r["verdict"].p if r["tested"] else 1.0
                             for r in rows if not r["claim"].same_as
                             and (r["claim"].id in reg.AFTER_EXPLORATORY) == later})
    for row in rows:
        v, c = row["verdict"], row["claim"]
        if row["tested"]:  # a claim equal to another is decided at that one's adjusted p
            p_holm = adjusted[c.same_as or c.id]
            decided = cs.decide(row["differences"], c.direction, c.margin, p_holm)
            decided, why = apply_stability(row, decided)
            if not row["testable"]:
                row["test_alone"], decided, why = decided, v.verdict, ""
            reason = "; ".join(x for x in (v.reason, why) if x)
            v = cs.Verdict(decided, v.difference, v.p, p_holm, v.detectable, reason)
        row["verdict"] = v
        if c.same_as:
            row["identical"] = _identical(c, records, row["seeds"])
    return rows
