"""The report's words for one claim: its verdict, effect, per-arm rows and section."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.entries import Claim
from fedtune_app.claims.planning import RateChoice
from fedtune_app.claims.registry import (
    SETTINGS,
    claim_settings,
)
from fedtune_app.claims.store import best_points, curve_points, final_points, primary_points
from fedtune_app.claims.verdicts import BELOW_TARGET, GAP_TARGET

NOT_READABLE = "not readable"


def paper_readable(claim: Claim) -> bool:
    """Whether the paper's own difference could be read (None or NaN: it could not)."""
    return claim.paper_difference is not None and math.isfinite(claim.paper_difference)


def paper_text(claim: Claim) -> str:
    return f"{claim.paper_difference:+.2f}" if paper_readable(claim) else NOT_READABLE


def effect_text(row: dict) -> tuple[str, str]:
    """(where the paper's difference lies against ours, ours / gap beside the paper's ratio);
    a paper whose difference could not be read has no position ("-") and no ratio ("n/a")."""
    c, v = row["claim"], row["verdict"]
    if v.difference is None or v.difference.n < 2:
        return "-", "-"
    readable = paper_readable(c)
    position = cs.effect_position(c.paper_difference, v.difference) if readable else "-"
    st = SETTINGS[claim_settings(c)[0]]
    gap = row["gaps"].get(st.id, (None,))[0]
    ours = f"{v.difference.mean / gap.mean:+.2f}" if gap and gap.mean else "-"
    paper = (f"{c.paper_difference / (st.paper_large - st.paper_small):+.2f}"
             if readable and st.paper_large is not None and st.paper_small is not None
             else "n/a")
    return position, f"{ours} (paper {paper})"


def ci_text(iv: cs.Interval | None) -> str:
    if iv is None:
        return "-"
    if iv.n < 2:
        return f"{iv.mean:.2f} (n=1)"
    return f"{iv.mean:.2f} ± {iv.half_width:.2f}"


def p_text(p: float) -> str:
    return "-" if not math.isfinite(p) else f"{p:.3g}" if p >= 1e-4 else "<1e-4"


def findings_text(row: dict) -> str:
    """The two findings about arms, each under its own name: an arm that collapsed (read on its
    validation curves) and an arm no better than AllSmall (the smallest model on every client)."""
    text = ""
    if row["collapse"]:
        text += f"; {cs.COLLAPSED}: " + ", ".join(
            f"{arm} {drop:+.2f} points from its best" for arm, drop in row["collapse"].items())
    if row["below_small"]:
        text += f"; {cs.NO_BETTER_THAN_SMALL}: " + ", ".join(
            f"{arm} {ci_text(d)} against AllSmall" for arm, d in row["below_small"].items())
    return text


def verdict_text(row: dict) -> str:
    v = row["verdict"]
    text = f"**{v.verdict}**"
    if v.reason:
        text += f" ({v.reason})"
    if row.get("test_alone"):
        text += f"; the test alone: {row['test_alone']}"
        if round_sides(row) in ({"+"}, {"-"}):
            text += f", on the same side at each of the last {len(row['by_round'])} evaluations"
    text += findings_text(row)
    if row.get("below_target"):
        text += f"; {BELOW_TARGET}"
    if row["claim"].same_as and row.get("identical") is not None:
        text += "; runs identical" if row["identical"] else "; runs differ"
    return text


def arm_row(arm: str, rs: list[dict], choice: RateChoice | None = None) -> str:
    """One arm's row of a setting's table: the primary metric over its seeds and its final
    round, with DepthFL's ensemble or, for a method that trains several model groups, the
    smallest and largest group's own model beside it (their mean, the headline, can hide one
    group that learnt nothing); the validation-chosen round, the convergence window, the rate."""
    prim = cs.t_interval([primary_points(r) for r in rs])
    finals = cs.t_interval([final_points(r) for r in rs])
    secs = f"{sum(r['seconds'] for r in rs) / len(rs):.0f}"
    if all("cpu-seconds" in r for r in rs):
        secs += f" (CPU {sum(r['cpu-seconds'] for r in rs) / len(rs):.0f})"
    last = [r["curve"][-1] for r in rs]

    def final_of(key: str) -> str:
        return ci_text(cs.t_interval([100 * p[key] for p in last]))

    finals_text = ci_text(finals)
    if all("accuracy-ensemble" in p for p in last):  # DepthFL
        finals_text += f" (ensemble {final_of('accuracy-ensemble')})"
    elif all("accuracy-smallest" in p for p in last) and any(
            p["accuracy-smallest"] != p["accuracy-largest"] for p in last):
        finals_text += (f" (smallest model {final_of('accuracy-smallest')}, "
                        f"largest {final_of('accuracy-largest')})")
    selected = "-"
    if choice is not None and choice.best_round is not None:
        at = [dict(curve_points(r)).get(choice.best_round) for r in rs]
        if None not in at:
            selected = f"{np.mean(at):.2f} (round {choice.best_round})"
    try:
        ok, gains = cs.arm_convergence([curve_points(r) for r in rs])
        window = ci_text(gains) + ("" if ok is None else " flat" if ok else " rising")
    except ValueError:
        window = "too few evaluations"
    under_best = np.mean([final_points(r) - best_points(r) for r in rs])
    lr = rs[0].get("lr")
    return (f"| {arm} | {len(rs)} | {ci_text(prim)} | {finals_text} | {selected} | {window} | "
            f"{under_best:+.2f} | "
            f"{'-' if lr is None else f'{lr:g}'} | {sum(r['rejected-replies'] for r in rs)} | "
            f"{secs} |")


ARM_HEADER = ["| arm | seeds | primary % (95% CI) | final % (95% CI) | validation-chosen round "
              "(test %) | last-20% gain (95% CI), flat by 1 point | final - own best (test, "
              "a description) | lr | rejected replies | seconds per run (CPU) |",
              "|---|---|---|---|---|---|---|---|---|---|"]


def difference_text(row: dict) -> str:
    """The claim's difference with its interval and the interval's level, or '-'."""
    d = row["verdict"].difference
    return "-" if d is None else f"{ci_text(d)} ({d.confidence:.0%})" if d.n > 1 else ci_text(d)


def beside_text(row: dict) -> str:
    """A claim at the papers' 0.01: its difference (the size, not only the verdict) and verdict."""
    if row["verdict"].difference is None:
        return verdict_text(row)
    return f"{difference_text(row)}: {verdict_text(row)}"


def _word(row: dict) -> str:
    """What a row's test says: its verdict, or what its test alone says where the gate failed."""
    return row.get("test_alone") or row["verdict"].verdict


SHORT = {"the learning rate": "lr", "the papers' 100 rounds": "100 rounds"}


def _against(row: dict, other: dict | None, what: str, label: str, need: str
             ) -> tuple[str, str]:
    """One part of ``robustness``: (robust / sensitive / not checked, its text), the claim
    against its row under another choice."""
    if other is None or not other["tested"]:
        return "not checked", f"{what} not checked ({need})"
    ours, theirs = row["verdict"].difference.mean, other["verdict"].difference.mean
    numbers = f"{ours:+.2f} here, {theirs:+.2f} {label}"
    if _word(row) == _word(other) and (ours > 0) == (theirs > 0):
        return "robust", f"robust to {what} ({numbers})"
    return "sensitive", f"**sensitive to {what}** ({_word(row)} -> {_word(other)}; {numbers})"


def robustness_parts(row: dict, at_paper_rate: dict | None, checks: dict | None = None
                     ) -> list[tuple[str, str, str]]:
    """The registry's ``ROBUSTNESS_RULE``, part by part: (what, word, text) against the papers'
    0.01 and against each check that names the claim (``checks``: check id -> {claim id: row})."""
    if not row["tested"]:
        return []
    parts = [("the learning rate", *_against(row, at_paper_rate, "the learning rate", "at 0.01",
                                              "the papers' 0.01 not all in"))]
    for check_id, rows in (checks or {}).items():
        check = reg.CHECKS[check_id]
        if row["claim"].id in check.claims:
            parts.append((check.what, *_against(row, rows.get(row["claim"].id), check.what,
                                                f"with {check.what}",
                                                f"{check.seeds} seeds not all in")))
    return parts


def robustness(row: dict, at_paper_rate: dict | None, checks: dict | None = None) -> str:
    """The claim's robustness in words, with the numbers behind each part."""
    parts = robustness_parts(row, at_paper_rate, checks)
    return "; ".join([text for _, _, text in parts] + [reg.NOT_CHECKED]) if parts else "-"


def robustness_word(row: dict, at_paper_rate: dict | None, checks: dict | None = None) -> str:
    """``robustness`` in a few words, for the forest plot."""
    parts = robustness_parts(row, at_paper_rate, checks)
    by_word = {w: [SHORT.get(what, what) for what, word, _ in parts if word == w]
               for w in ("sensitive", "robust")}
    return "; ".join(f"{w} to {', '.join(whats)}" for w, whats in by_word.items() if whats)


def verdict_rows(rows: list[dict], at_paper_rate: dict | None = None,
                 checks: dict | None = None) -> list[str]:
    """The verdict table of a tier; ``at_paper_rate``: claim id -> its row at the papers' 0.01,
    shown in a last column (tuned tiers), with the claim's robustness (``checks``: as
    ``robustness_parts``)."""
    head = ("| claim | paper | paper's difference | ours: difference (CI) | paper's against "
            "ours | ours / gap (paper's) | p | Holm p | detectable | seeds | verdict |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|"
    if at_paper_rate is not None:
        head += " at lr 0.01: difference (CI), verdict | robustness |"
        rule += "---|---|"
    lines = [head, rule]
    for row in rows:
        c, v = row["claim"], row["verdict"]
        position, ratio = effect_text(row)
        ci = difference_text(row)
        line = (f"| `{c.id}` | {c.paper} {c.table} | {paper_text(c)} | {ci} | "
                f"{position} | {ratio} | {p_text(v.p)} | {p_text(v.p_holm)} | "
                f"{'-' if not math.isfinite(v.detectable) else f'{v.detectable:.2f}'} | "
                f"{len(row['seeds'])}/{row['need']} | {verdict_text(row)} |")
        if at_paper_rate is not None:
            paper_row = at_paper_rate.get(c.id)
            line += (f" {'-' if paper_row is None else beside_text(paper_row)} | "
                     f"{robustness(row, paper_row, checks)} |")
        lines.append(line)
    return lines


def round_sides(row: dict) -> set:
    """The sides of the boundary the claim's single-round intervals lie on."""
    c = row["claim"]
    return {cs.interval_side(ci, c.direction, c.margin) for _, ci in row["by_round"]}


def by_round_text(row: dict) -> str:
    """The difference at each of the last evaluated rounds, with the side its interval lies on
    (no adjustment for reading it several times: a check of stability, not a test)."""
    c = row["claim"]
    reads = [(r, ci, cs.interval_side(ci, c.direction, c.margin)) for r, ci in row["by_round"]]
    if not reads:
        return "- Read at single rounds: no round that every run evaluated."
    sides = {side for _, _, side in reads}
    same = ("the same side at every one" if sides in ({"+"}, {"-"})
            else "the side changes with the round" if {"+", "-"} <= sides
            else "across the boundary at some")
    return (f"- Read at single rounds ({reads[0][1].confidence:.0%} intervals, unadjusted; "
            "+ the claim's side, - the other, ? across): "
            + ", ".join(f"round {r} {ci_text(ci)} {side}" for r, ci, side in reads) + f": {same}.")


def _epochs(n: int) -> str:
    return f"{n} local epoch{'s' * (n != 1)} a round"


def run_length(tier: str, setting_id: str, arm: str) -> tuple[int, int]:
    """(local epochs a round, rounds) of an arm's runs on a tier."""
    from fedtune_app.claims.store import run_config
    from fedtune_app.methods import resolve_config

    keys = resolve_config(run_config(tier, setting_id, arm, 0)).flat
    return keys["local-epochs"], keys["num-server-rounds"]


def step_count_text(claim: Claim, tier: str) -> str:
    """Whether the check at the papers' 0.01 ran at the paper's step count (``PAPER_STEPS``),
    and if not, what share of the paper's local epochs it got."""
    paper = reg.PAPER_STEPS.get(claim.paper)
    here = sorted({run_length(tier, st, a) for _, st, a in claim.terms})
    ours = "here " + " and ".join(f"{_epochs(e)} for {r} rounds" for e, r in here)
    if paper is None or paper.local_epochs is None:
        why = paper.source if paper else "nothing of it in the registry"
        return (f"Step count: the paper's not known ({why}); {ours}: whether 0.01 ran at the "
                "paper's step count cannot be said.")
    stated = _epochs(paper.local_epochs) + (f" for {paper.rounds} rounds" if paper.rounds
                                            else ", its rounds not stated")
    # without the paper's rounds only a round's epochs compare
    shares = sorted({Fraction(e * (r if paper.rounds else 1),
                              paper.local_epochs * (paper.rounds or 1)) for e, r in here})
    a_round = "" if paper.rounds else " a round"
    if shares == [1]:
        verdict = ("0.01 ran at the paper's step count" if paper.rounds else
                   "0.01 ran at the paper's local epochs a round, over rounds it does not state")
    else:
        verdict = ("not the paper's step count: 0.01 gets " + " and ".join(map(str, shares))
                   + f" of the paper's local epochs{a_round}")
    return f"Step count: the paper {stated} ({paper.source}); {ours}, so {verdict}."


def paper_rate_text(row: dict) -> str:
    """A claim's line at the papers' 0.01 (every arm at it, the claim's own seeds); on a tier
    that tunes the rate, whether it ran at the paper's step count (``step_count_text``)."""
    c = row["claim"]
    rerun = f"`fedtune claims run {c.id} --tier {row['tier']} --lr paper`"
    steps = f" {step_count_text(c, row['tier'])}" if row["tier"] in reg.LR_GRID else ""
    if not row["seeds"]:
        return f"- At the papers' 0.01: no records yet ({rerun}).{steps}"
    arms = "; ".join(f"{arm} {ci_text(info['primary'])}" for arm, info in row["per_arm"].items())
    return (f"- At the papers' 0.01 for every arm ({len(row['seeds'])} of {row['need']} "
            f"seeds; {rerun}): {arms}; difference {beside_text(row)}.{steps}")


def claim_section(row: dict, tier: str, choices: dict, at_paper_rate: dict | None = None
                  ) -> list[str]:
    """A claim's section; ``at_paper_rate``: its row at the papers' 0.01 (tuned tiers)."""
    c, v = row["claim"], row["verdict"]
    lines = [f"#### `{c.id}`: {verdict_text(row)}", "",
             f"{c.paper}, {c.table}: {c.sentence}. Direction: {c.direction}"
             + (f", margin {c.margin:g} points" if c.margin else "") + ".", "",
             f"- Paper: {c.paper_numbers} (difference {paper_text(c)}).",
             f"- Settings: {', '.join(f'`{s}`' for s in claim_settings(c))}; statistic: "
             + " ".join(f"{w:+g} x {a} ({s})" for w, s, a in c.terms) + ".",
             f"- Choices: {c.choices}"]
    if c.margin_reason:
        lines.append(f"- Margin: {c.margin_reason}.")
    if c.same_as:
        same = {True: " Here its runs are identical to that claim's, evaluation for evaluation.",
                False: " Here its runs DIFFER from that claim's.", None: ""}[row.get("identical")]
        lines.append(f"- Same as `{c.same_as}`: {c.same_reason}.{same}")
    rerun = f"fedtune claims run {c.id} --tier {tier}"
    if tier in reg.LR_GRID:
        rerun = f"fedtune claims tune {c.id} --tier {tier} && {rerun}"
    lines.append(f"- Rerun: `{rerun}`")
    if not row["seeds"]:
        return lines + [f"- {cs.NOT_RUN}.", ""]
    parts = []
    for arm, info in row["per_arm"].items():
        text = f"{arm} {ci_text(info['primary'])} (final {ci_text(info['final'])}"
        if info["selected"]:
            text += f"; at the validation-chosen round {info['selected'][0]}: "
            text += f"{info['selected'][1]:.2f}"
        if info["lr"] is not None:
            text += f"; lr {info['lr']:g}"
        parts.append(text + ")")
    lines.append(f"- Ours (primary metric %, mean ± 95% CI over seeds "
                 f"{', '.join(map(str, row['seeds']))}): " + "; ".join(parts) + ".")
    d = v.difference
    if d is not None and d.n > 1:
        se_seeds = d.std / math.sqrt(d.n)
        err, how = row.get("test_error", (math.nan, ""))
        lines.append(f"- Paired difference: {ci_text(d)} points ({d.confidence:.0%} interval, "
                     "seeds and test set), per seed "
                     + ", ".join(f"{x:+.2f}" for x in row["differences"])
                     + f"; p {p_text(v.p)}, Holm {p_text(v.p_holm)}; detectable with "
                     f"{row['need']} seeds: {v.detectable:.2f} points.")
        lines.append(f"- Error of the mean difference: seeds {se_seeds:.2f} points (s / sqrt(n)); "
                     + (f"test set {err:.2f} points ({how}); together "
                        f"{math.hypot(se_seeds, err):.2f}." if math.isfinite(err)
                        else "test set: unknown for these records."))
        position, ratio = effect_text(row)
        lines.append(f"- Effect size: the paper's {paper_text(c)} against ours: "
                     f"{position}; difference / (AllLarge - AllSmall): {ratio}.")
        lines.append(by_round_text(row))
        trend = row.get("trend")
        lines.append("- Stability: the difference moved "
                     + (f"{ci_text(trend)} points over the last 20% of rounds (95% CI)"
                        if trend is not None else "by an unknown amount (too few evaluations)")
                     + f" (`VERDICT_RULE`, {reg.VERDICT_RULE_DATE}).")
    conv = "; ".join(f"{a} {ci_text(g) if isinstance(g, cs.Interval) else g}"
                     for a, (_, g) in row["convergence"].items())
    lines.append(f"- Each arm's gain over the last 20% of rounds (points, 95% CI; a "
                 f"description, not a gate): {conv}.")
    gaps = "; ".join(
        f"`{st}` AllLarge - AllSmall {ci_text(gap)} over seeds {', '.join(map(str, ss))}"
        + ("" if ok is None else " > " if ok else " **not above** ")
        + (f"{v.detectable:.2f}" if ok is not None else "")
        for st, (gap, ok, ss) in row["gaps"].items() if gap is not None) or "not run"
    if row["tier"] in reg.TIER_SEEDS and any(gap for gap, _, _ in row["gaps"].values()):
        gaps += (f"; the tier's design target, a mean of at least {GAP_TARGET:g} points: "
                 + (f"**not met** in {', '.join(f'`{st}`' for st in row['below_target'])}"
                    if row["below_target"] else "met"))
    lines.append(f"- Gate, discrimination: {gaps}.")
    lines.append(f"- Findings: collapse (validation curves at the chosen rate, final more than "
                 f"{cs.COLLAPSE_POINTS:g} points under the best): "
                 + (", ".join(f"{a} {d:+.2f}" for a, d in row["collapse"].items()) or "none")
                 + "; no better than AllSmall (paired primary difference, mean at most 0): "
                 + (", ".join(f"{a} {ci_text(d)}" for a, d in row["below_small"].items())
                    or "none") + ".")
    if at_paper_rate is not None:
        lines.append(paper_rate_text(at_paper_rate))
    return lines + [""]
