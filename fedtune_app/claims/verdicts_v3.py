"""Rule v3 (the registry's ``RULE_V3``) applied to a tier's confirmatory seeds: per claim the
paired differences, one interval holding the seeds' spread and the test set's closed-form
error, the gate per setting, the test, Holm over the declared family, the drift test, and the
robustness word on the paired change to the papers' 0.01 where its records exist. The
exploratory seeds stay with ``verdicts.evaluate`` and its rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.entries import Claim
from fedtune_app.claims.planning import load_records
from fedtune_app.claims.registry import claim_settings, tiers_of
from fedtune_app.claims.store import STORE
from fedtune_app.claims.verdicts import (
    difference_curves,
    gap_terms,
    paired_differences,
    seeds_with,
    test_set_error,
    trend_test_error,
)

WITHHELD = "withheld"  # its test is in, its family's other members not yet
CANNOT_SHOW = "this tier cannot show it"
PAPER_ARM = "lr 0.01: "  # the papers'-rate runs' arms, beside the tuned ones in one dict


@dataclass(frozen=True)
class Gate:
    """A setting's AllLarge - AllSmall with both errors, on the confirmatory seeds both have;
    ``passes``: its lower end above the tier's planned detectable difference (None while not
    every seed is in)."""

    gap: cs.Interval | None
    seeds: list[int]
    passes: bool | None


def interval_v3(terms, tier: str, records: dict, seeds: list[int], confidence: float
                ) -> tuple[cs.Interval, list[float], tuple]:
    """Rule v3's one error model: (interval, per-seed differences, (test-set se, how))."""
    diffs = paired_differences(terms, records, seeds)
    error = test_set_error(terms, tier, records, seeds, closed_form=True)
    return cs.combined_interval(diffs, error[0], confidence), diffs, error


def setting_gate(setting_id: str, tier: str, records: dict, seeds) -> Gate:
    have = seeds_with(gap_terms(setting_id), records, seeds)
    if len(have) < 2:
        return Gate(None, have, None)
    gap = interval_v3(gap_terms(setting_id), tier, records, have, 0.95)[0]
    done = len(have) == len(seeds)
    return Gate(gap, have, gap.low > reg.PLANNED_DETECTABLE[tier] if done else None)


def drift(claim: Claim, tier: str, records: dict, seeds: list[int], mean: float
          ) -> tuple[float, cs.Interval, str] | None:
    """The drift test (``stats.drift_test``) of the claim's difference towards its null, with
    the trend's closed-form test-set error where the records keep both windows example by
    example (``trend_test_error``): (p, the trend's interval, how its test-set error was
    had); None with too few evaluations for the two windows."""
    curves = difference_curves(claim, records, seeds)
    try:
        windows = cs.trend_windows([r for r, _ in curves[0]])
    except ValueError:
        return None
    trends = [cs.window_gain(c) for c in curves]
    test_se, how = trend_test_error(claim.terms, tier, records, seeds, windows)
    return (*cs.drift_test(trends, test_se, cs.towards_null(mean, claim.direction,
                                                            claim.margin)), how)


def claim_row(claim: Claim, tier: str, records: dict, seeds, gates: dict) -> dict:
    """A claim's numbers before its family's Holm (``judge`` finishes it)."""
    have = seeds_with(claim.terms, records, seeds)
    row = {"claim": claim, "tier": tier, "seeds": have, "need": len(seeds), "tested": False,
           "differences": [], "drift": None,
           "gaps": {st: (gates[st].gap, gates[st].passes, gates[st].seeds)
                    for st in claim_settings(claim)}}
    if reg.cannot_show(claim, tier):
        row["verdict"] = cs.Verdict(CANNOT_SHOW, reason=(
            f"margin {claim.margin:g} under the tier's smallest detectable margin "
            f"{reg.SMALLEST_DETECTABLE_MARGIN[tier]:g}: left out of the campaign and the family"))
        return row
    if len(have) < 2:
        same = f"same as {claim.same_as}: one hypothesis" if claim.same_as else ""
        row["verdict"] = cs.Verdict(cs.NOT_RUN if not have else cs.RUNNING, reason="; ".join(
            x for x in (reg.confirmatory_waits(claim), same) if x))
        return row
    ci, diffs, error = interval_v3(claim.terms, tier, records, have,
                                   cs.interval_for(claim.direction))
    p = cs.p_value(diffs, claim.direction, claim.margin, error[0])
    row |= {"differences": diffs, "test_error": error, "tested": len(have) == len(seeds),
            "drift": drift(claim, tier, records, have, ci.mean)}
    reason = "" if row["tested"] else f"{len(have)} of {len(seeds)} confirmatory seeds"
    row["verdict"] = cs.Verdict(cs.INCONCLUSIVE if row["tested"] else cs.RUNNING, ci, p,
                                reason=reason)
    return row


def waiting_text(waiting: list[str]) -> str:
    return f"waiting for {len(waiting)} member{'s' * (len(waiting) != 1)}"


def drift_text(found: tuple[float, cs.Interval, str]) -> str:
    p, trend, _ = found
    return (f"the difference drifts {trend.mean:+.2f} points (95% CI {trend.low:+.2f} to "
            f"{trend.high:+.2f}) over the last window, towards the null with p = {p:.3g}")


def decide_row(row: dict, adjusted: dict | None, waiting: list[str], family: str) -> None:
    """A tested claim's verdict: the gate, then its family's Holm, then the drift test."""
    c, v = row["claim"], row["verdict"]
    if not row["tested"]:
        return
    p_holm = adjusted[c.same_as or c.id] if adjusted else math.nan
    blind = [st for st, (_, ok, _) in row["gaps"].items() if ok is False]
    notes = [f"same as {c.same_as}: one hypothesis, counted once"] if c.same_as else []
    if blind:
        decided = cs.NOT_DISCRIMINATIVE
        notes.insert(0, "AllLarge - AllSmall's lower end not above the planned detectable "
                     f"{reg.PLANNED_DETECTABLE[row['tier']]:g} points in " + ", ".join(blind))
    elif any(ok is None for _, ok, _ in row["gaps"].values()):
        decided = cs.RUNNING
        notes.insert(0, "AllLarge / AllSmall not all in")
    elif adjusted is None:
        decided = WITHHELD
        notes.insert(0, f"family `{family}` {waiting_text(waiting)}")
    else:
        decided = cs.decide(row["differences"], c.direction, c.margin, p_holm)
    found = row["drift"]
    if found and found[0] < cs.ALPHA and decided in (cs.REPRODUCED, cs.REFUTED):
        notes.insert(0, f"{decided} at the primary metric, but " + drift_text(found))
        decided = cs.UNSTABLE
    elif found and not found[1].low <= 0 <= found[1].high:
        notes.append(f"the difference still drifts {found[1].mean:+.2f} points (95% CI "
                     f"{found[1].low:+.2f} to {found[1].high:+.2f}) over the last window")
    row["verdict"] = cs.Verdict(decided, v.difference, v.p, p_holm, v.detectable,
                                "; ".join(notes))


def judge(tier: str, records: dict, family: str) -> list[dict]:
    """Every claim of the tier on its confirmatory seeds, Holm over ``family`` (a name of
    ``registry.v3_families``) once every member has all its seeds."""
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    claims = [c for c in reg.CLAIMS.values() if tier in tiers_of(c)]
    gates = {st: setting_gate(st, tier, records, seeds)
             for st in dict.fromkeys(st for c in claims for st in claim_settings(c))}
    rows = [claim_row(c, tier, records, seeds, gates) for c in claims]
    members = reg.v3_families(tier)[family]
    by_id = {r["claim"].id: r for r in rows}
    waiting = [m for m in members if not by_id[m]["tested"]]
    adjusted = cs.family_holm(members, {m: by_id[m]["verdict"].p for m in members
                                        if by_id[m]["tested"]})
    for row in rows:
        decide_row(row, adjusted, waiting, family)
    return rows


def paired_change(claim: Claim, tier: str, records: dict, paper_records: dict, seeds
                  ) -> tuple[cs.Interval, float] | None:
    """The claim's difference at the papers' 0.01 minus at its tuned rates, per seed, with
    both errors (95%) and its two-sided p of 0; None until both have every seed."""
    paper_terms = tuple((c, st, PAPER_ARM + a) for c, st, a in claim.terms)
    both = records | {(st, PAPER_ARM + a, s): r for (st, a, s), r in paper_records.items()}
    terms = paper_terms + tuple((-c, st, a) for c, st, a in claim.terms)
    if len(seeds_with(terms, both, seeds)) < len(seeds):
        return None
    ci, changes, error = interval_v3(terms, tier, both, list(seeds), 0.95)
    return ci, cs.p_value(changes, "greater", 0.0, error[0])


def add_robustness(rows: list[dict], at_paper: list[dict], records: dict, paper_records: dict,
                   tier: str) -> None:
    """Each row's ``lr`` entry: (change interval, Holm p, word) with the word from
    ``stats.change_word`` once the 0.01 family's changes are all in, else the wait."""
    family = f"{tier}: lr 0.01"
    members = reg.v3_families(tier)[family]
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    paper_by_id = {r["claim"].id: r for r in at_paper}
    changes = {r["claim"].id: paired_change(r["claim"], tier, records, paper_records, seeds)
               for r in rows if r["tested"]}
    adjusted = cs.family_holm(members, {m: ch[1] for m, ch in changes.items() if ch})
    waiting = [m for m in members if not changes.get(m)]
    for row in rows:
        c = row["claim"]
        change = changes.get(c.same_as or c.id)
        if change is None:
            row["lr"] = None
        elif adjusted is None:
            row["lr"] = (change[0], math.nan, waiting_text(waiting))
        else:
            p_holm = adjusted[c.same_as or c.id]
            row["lr"] = (change[0], p_holm, cs.change_word(
                change[0], p_holm, row["verdict"].verdict,
                paper_by_id[c.id]["verdict"].verdict, reg.ROBUST_BAND[tier]))


def evaluate_v3(tier: str = "mini", store: Path = STORE, records: dict | None = None,
                paper_records: dict | None = None) -> list[dict]:
    """One row per claim of the tier with its rule-v3 verdict on the confirmatory seeds
    (``records``: (setting, arm, seed) -> record at the widened grid's rates; ``paper_records``: the
    same at the papers' 0.01, for the robustness word; both read from ``store`` when
    ``records`` is not given)."""
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    if records is None:
        records = load_records(tier, store, seeds=seeds, widened=True)
        paper_records = load_records(tier, store, "paper", seeds=seeds)
    paper_records = paper_records or {}
    rows = judge(tier, records, tier)
    add_robustness(rows, judge(tier, paper_records, f"{tier}: lr 0.01"), records,
                   paper_records, tier)
    return rows


def family_status(tier: str, rows: list[dict]) -> str:
    """The tier's family: reported, or how many members it waits for."""
    members = reg.v3_families(tier)[tier]
    tested = {r["claim"].id for r in rows if r["tested"]}
    waiting = [m for m in members if m not in tested]
    if not waiting:
        return f"family `{tier}`: all {len(members)} members in, Holm-adjusted"
    return (f"family `{tier}`: {len(members) - len(waiting)} of {len(members)} members in, "
            f"Holm withheld, {waiting_text(waiting)}")
