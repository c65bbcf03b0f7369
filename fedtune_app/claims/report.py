"""docs/claims.md and the README's verdict table, from the stored records."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.claim_text import (
    ARM_HEADER,
    arm_row,
    ci_text,
    claim_section,
    effect_text,
    p_text,
    robustness_word,
    verdict_rows,
)
from fedtune_app.claims.per_model import TABLE1_SETTINGS, per_model_section, planned_arms
from fedtune_app.claims.planning import (
    load_records,
    plan_runs,
    tier_pairs,
    tiers_of,
    tuned_rates,
    validation_gaps,
)
from fedtune_app.claims.plots import forest_plot, plot_setting
from fedtune_app.claims.registry import (
    ARMS,
    CPU_BASE,
    CPU_GROUPS,
    METRIC_NOTE,
    SETTINGS,
)
from fedtune_app.claims.store import (
    MAX_SEEDS,
    README,
    README_BEGIN,
    README_END,
    REPORT,
    STORE,
    TIERS,
    checkpoints_by_setting,
    code_commit,
    cost_to_do,
    made_by_older_code,
    record_method,
    records_by_hash,
    run_cost,
)
from fedtune_app.claims.verdicts import (
    GAP_TARGET,
    READ_AT_ROUNDS,
    TREND_SEEDS_ONLY,
    evaluate,
    seeds_with,
    setting_gap,
)
from fedtune_app.claims.verdicts_v3 import evaluate_v3, family_status
from fedtune_app.tools.fingerprint import code_fingerprints

CONTINUE = {"mini": "fedtune claims tune --tier mini && fedtune claims run --tier mini",
            "cpu": "OMP_NUM_THREADS=1 fedtune claims run --tier cpu",
            "gpu": "fedtune claims run --tier gpu",
            "paper": "fedtune claims run --tier paper --data-dir nico++=/data/nico "
                     "--data-dir domainnet=/data/domainnet"}


def _continue(tier: str) -> str:
    return CONTINUE.get(tier, f"fedtune claims run --tier {tier}")


def _grid(tier: str) -> str:
    return ", ".join(f"{x:g}" for x in reg.LR_GRID[tier])


TIER_TITLE = {"mini": "the papers' design in miniature",
              "cpu": "label skew, a setting the papers did not run",
              "gpu": "the papers' depth on real weights", "paper": "the papers' own presets"}
TIER_TEXT = {
    "mini": "The papers' design in miniature: a 12-block ViT pretrained offline (a stand-in for "
            "the papers' ImageNet weights, which no package here ships) on six domains, one "
            "client per domain and every class on every client (FedRA's and FedBRICK's feature "
            "skew), the papers' capacity profiles unscaled (12,10,8,6,4,3; 6*6; 4*6; 10*6; "
            "10,10,6,6,4,4; U[1,12] each round with AllSmall on 3; FedBRICK's 12,10,8,6,5,4), "
            "AllLarge and AllSmall as the papers define them; the LoRA-rank papers' headline "
            "comparisons on the same model and splits with all 12 blocks on every client and "
            "LoRA ranks 8,8,4,4,2,2 or 8 on all (our profiles: only their abstracts could be "
            "read), the gate FedIT with every client at rank 8 against rank 2: presets "
            "`conf/mini.toml` (depth and rank methods), `conf/mini-groups.toml` "
            "(HeteroTune's model groups, the domain-silo variant: ViTs of several widths "
            "pretrained the same way, one style per client) and `conf/mini-pooled.toml` "
            "(HeteroTune in its paper's design: Dirichlet(0.1) label skew over the pooled "
            "styles, 20 clients, four sizes including a 24-block model). "
            f"{reg.TIER_SEEDS['mini']} paired seeds per claim. Each arm's rate is chosen once per "
            "setting on the validation split carved from the training pool "
            f"(`evaluation-split = \"validation\"`) on seeds "
            f"{', '.join(map(str, reg.TUNING_SEEDS))} (no claim uses them): for the exploratory "
            f"seeds from {{{_grid('mini')}}}, {reg.LR_RULE}; for the confirmatory seeds from "
            "that grid widened until no choice sits at its edge (the table Learning rates). "
            "Calibration on the validation split (seed 100; [calibration-mini.md]"
            "(claims/calibration-mini.md)): AllLarge - AllSmall 41.1 points after 60 rounds "
            "(depth; AllLarge flat on that seed, AllSmall still rising 1.5 points over its last "
            "20% of rounds) and 24.0 after 30 (widths; not flat); the claims' own seeds decide "
            "whether a setting discriminates (the gate). Each arm's gain over the last 20% of "
            "rounds is shown as a description; what decides whether a verdict stands is the "
            "claim's difference, not an arm's curve (the verdict rule below).",
    "cpu": "Label skew, a setting the papers did not run (they ran feature skew: every client "
           "holds every class). all-MiniLM-L6-v2 (6 blocks x 384, real pretrained weights) on "
           f"BBC News: {CPU_BASE['train-subset']} training articles (stratified subset of the "
           "fixed 80/20 split; 5% of them held out as FedBRICK's server proxy for every method) "
           "over 6 clients with Dirichlet(0.5) label skew, the whole test split (445 articles), "
           f"{CPU_BASE['max-length']} tokens, batch {CPU_BASE['batch-size']}, 1 local epoch, SGD "
           "lr 0.01 (momentum 0.9, weight decay 1e-5, clip 10) for every method: the papers' own "
           "rate, never tuned, "
           f"{CPU_BASE['num-server-rounds']} rounds, evaluated every "
           f"{CPU_BASE['eval-every']} (the rounds were chosen by a pilot read on the test set). "
           "Capacity shapes of each table scaled from 12 to 6 "
           "blocks (each setting says how). The model-group (HeteroTune) settings: "
           f"{CPU_GROUPS['model-groups'].replace(';', ' + ')} on the same articles, "
           f"Dirichlet({CPU_GROUPS['dirichlet-alpha']}) label skew (at least "
           f"{CPU_GROUPS['min-partition-size']} articles a client), "
           f"{CPU_GROUPS['local-epochs']} local epochs, {CPU_GROUPS['num-server-rounds']} rounds "
           f"evaluated every {CPU_GROUPS['eval-every']}, the same rate; Homo, AllLarge, "
           "AllSmall, FedDF and FlexiFed fine-tune whole models, HeteroTune, pFedLoRA and FedMD "
           "adapters and heads (HeteroTune Table 2's reading).",
    "gpu": "The papers' depth on real weights: the `mpnet-*` presets (all-mpnet-base-v2, 12 "
           "blocks x 768, BBC News, 256 tokens, 100 rounds, batch 128, lr 0.01) and the "
           "HeteroTune decoder presets (`heterotune-t3-glue-*`: LLaMA-3.2-1B + 3B, bf16, GLUE "
           "from the hub). Needs a CUDA GPU, `make assets` (MPNet), and for the LLaMA rows the "
           "hub (or the models and GLUE saved locally). Cost, measured on one H200 "
           "(`benchmarks/bench_claims_cost.py`, docs/performance.md): about 12.5 hours for the "
           "116 FedRA and FedBRICK runs (2-13 minutes each) and about 72 hours for the 27 "
           "HeteroTune runs other than FedDF's (1-6 hours each: 20 local epochs a round).",
    "paper": "The papers' own presets: ViT-B/16 (timm hub) on NICO++ / DomainNet under "
             "`data-dir`, CIFAR-10 from the hub for HeteroTune. Needs the data, the hub and a GPU.",
}

HOW_TO_READ = (
    "How to read it. Every method of a claim runs on the same seeds; a seed fixes the partition, "
    "the training subset, the allocation and capacity draws, the client sampling and the "
    "initial adapters for all of them, so each seed gives one paired difference (claimed side "
    "minus the other). The statistical plan is written in `fedtune_app/claims/registry.py`: "
    "each claim's seed count (no verdict, only **running**, until all are in), its direction "
    "and margin (with the margin's reason), the learning-rate grid and rule, and the verdict "
    "rules with their dates. "
    f"**Primary metric**: the mean of a run's last {cs.LAST_EVALUATIONS} evaluations; the final "
    "round and the round chosen on the validation split (tuned tiers) are shown beside it, never "
    "the best round on the test set. **Tests**, each at "
    f"alpha = {cs.ALPHA:g}: 'greater' a two-sided paired t-test with its 95% interval; 'within "
    "m' (non-inferiority) and 'similar within m' (equivalence, two one-sided tests) one-sided, "
    "with 90% intervals; each interval and p holds both the seeds' spread and the test set's "
    "sampling error (variance sum, the seeds' n - 1 degrees of freedom). The **Holm** column "
    f"(statsmodels) adjusts the p-values over every claim the tier plans (family-wise error "
    f"{cs.ALPHA:g}; a claim without all its seeds counts as p = 1, a claim equal to another "
    "once), and a verdict (**reproduced** / **refuted**) needs the adjusted p below it, else "
    "**inconclusive**. **The exploratory verdict rule** (the registry's `VERDICT_RULE` of "
    f"{reg.VERDICT_RULE_DATE}, written after most of the runs it judges had been seen; it "
    f"judges the exploratory seeds, and rule v3 above the confirmatory ones): {reg.VERDICT_RULE} "
    "A claim whose setting does not discriminate (AllLarge - AllSmall, paired 95% interval, "
    "lower end not above the claim's detectable difference) gets no verdict, only what its test "
    "alone would say. **Detectable**: the "
    f"smallest difference (for 'within' / 'similar': margin) the claim's seeds establish with "
    f"{cs.POWER:.0%} power at the observed spread (seeds and test set), from the exact "
    "noncentral t (statsmodels). **Effect size**: whether the paper's difference lies inside "
    "our interval (consistent), above it (ours smaller) or below it (ours larger); and the "
    "difference over the setting's AllLarge - AllSmall gap beside the paper's same ratio (n/a "
    "where the paper reports no AllSmall); a paper whose difference could not be read here "
    "(only its abstract) shows \"not readable\" and no position. **Findings**, each under its "
    f"own name and never a gate: **{cs.COLLAPSED}**, an arm whose validation curve (the tuning "
    f"runs at its chosen rate) ends more than {cs.COLLAPSE_POINTS:g} points under its own best "
    f"(the test set decides nothing); **{cs.NO_BETTER_THAN_SMALL}**, an arm whose paired "
    "primary difference to AllSmall is at most 0 on average. Each arm's gain over the last 20% "
    "of rounds is shown as a description. "
    "On a tier with a fixed seed count, a setting whose mean AllLarge - AllSmall is under the "
    f"{GAP_TARGET:g} points it was calibrated to reach is named in its claims' verdicts too. "
    f"**Read at single rounds**: each claim's difference is also shown at each of its last "
    f"{READ_AT_ROUNDS} evaluations with the side of the boundary its interval lies on "
    "(seeds only, unadjusted). "
    "**Test-set error**: a seed redraws the training data, not the test set, so the test set's "
    "own sampling error is added to the seeds' spread: a bootstrap over test examples where "
    "the records keep which examples each run got right (on `mini` over digits: a digit's six "
    "renderings resampled together), else the binomial bound "
    "sqrt(sum p (1 - p) / n). " + METRIC_NOTE)


def owner_test_section(store: Path) -> list[str]:
    """The label-skew tier's mechanism, from ``owner``'s record."""
    path = store / "label-skew-owner-test.json"
    if not path.is_file():
        return []
    t = json.loads(path.read_text())
    lines = ["### Why baselines collapse here: the owner test", "",
             f"Under label skew the one client holding all blocks is the only one that trains the "
             f"deepest block, so the full-depth model learns that client's labels. The test: "
             f"`{t['setting']}`, {t['arm']}, seed {t['seed']}, run twice "
             "(`python -m fedtune_app.claims.owner`, in-process, about 2.5 minutes a run "
             f"on one thread; code fingerprint `{t['fingerprint']}`).", "",
             "| arrangement | capacities | final % | peak % (round) | per-class final | "
             "per-class at peak | seconds |", "|---|---|---|---|---|---|---|"]
    names = t["runs"][0]["class-names"]
    for r in t["runs"]:
        per = lambda d: ", ".join(f"{n} {d[str(i)]:.2f}" for i, n in enumerate(names))  # noqa
        lines.append(f"| {r['arrangement']} | {r['capacities']} | {100 * r['final']:.1f} | "
                     f"{100 * r['peak']:.1f} ({r['peak-round']}) | {per(r['final-per-class'])} | "
                     f"{per(r['peak-per-class'])} | {r['seconds']:.0f} |")
    labels = t["runs"][0]["client-labels"]
    lines += ["", "Each client's training articles per class (" + ", ".join(names) + "): "
              + "; ".join(f"client {k} {v}" for k, v in labels.items()) + ".", ""]
    return lines


def older_code_section(tier: str, records: dict) -> list[str]:
    """Records not made by the code of this checkout: their fingerprint differs from their
    method's (``fingerprint``) or is absent."""
    current = code_fingerprints()
    used = {r["hash"]: r for r in records.values()}
    old = sorted((r for r in used.values() if made_by_older_code(r, current[record_method(r)])),
                 key=lambda r: (r.get("commit", ""), r.get("file", "")))
    methods = sorted({record_method(r) for r in used.values()})
    now = ", ".join(f"{m} `{current[m]}`" for m in methods)
    if not old:
        return [f"Every record of tier `{tier}` was made by this checkout's code (its method's "
                f"fingerprint: {now}).", ""]
    by_commit: dict = {}
    for r in old:
        by_commit.setdefault((r.get("commit", "?"), r.get("fingerprint", "none")), []).append(r)
    lines = [f"{len(old)} of the {len(used)} records of tier `{tier}` were made by older code "
             "than this checkout's (a record's fingerprint against its method's now: the "
             "package's sources but its tools, claims harness and other methods' modules; "
             + now + "). "
             f"`fedtune claims run --tier {tier} --rerun-older` runs them again (`--dry-run` "
             "first: what it costs). By the commit and fingerprint they record:", "",
             "<details><summary>the "
             "records</summary>", ""]
    for (commit, fp), rs in by_commit.items():
        lines.append(f"- commit `{commit}`, fingerprint `{fp}`: "
                     + ", ".join(f"`{r.get('file', r['hash'])}`" for r in rs))
    return lines + ["", "</details>", ""]


def checkpoint_section(tier: str, records: dict) -> list[str]:
    """Which backbone checkpoints the records loaded (their sha256, first 16 digits), and the
    settings whose records loaded different files of one name: the stand-ins are pretrained on
    the machine that runs, and two machines' files need not agree bit for bit."""
    used = {r["hash"]: r for r in records.values()}
    named = [r for r in used.values() if "checkpoints" in r]
    lines = [f"{len(named)} of the {len(used)} records of tier `{tier}` name the backbone "
             "checkpoints they loaded (the others were made before records named them)."]
    mixed = {k: v for k, v in sorted(checkpoints_by_setting(named).items()) if len(v) > 1}
    lines += [f"- setting `{setting}`: its records loaded {len(found)} different `{file}`: "
              + "; ".join(f"`{d}` ({len(rs)} records)" for d, rs in found.items())
              for (setting, file), found in mixed.items()]
    return lines + [""]


def write_report(tiers=TIERS, out: Path = REPORT, store: Path = STORE,
                 readme: Path | None = README) -> str:
    """docs/claims.md (and the curves' PNGs next to it) from the stored run records; the
    README's verdict table too (``readme=None``: not)."""
    evaluated = {tier: tier_rows(tier, store) for tier in tiers}
    v3 = {tier: evaluate_v3(tier, store) for tier in tiers if tier in reg.CONFIRMATORY_SEEDS}
    forest = [line for tier in tiers if tier in reg.LR_GRID  # the tiers that give verdicts
              for line in forest_section(tier, store, out, *evaluated[tier][1:], v3.get(tier))]
    lines = ["# The papers' claims: verdicts", "",
             f"Generated by `fedtune claims report` at code commit `{code_commit()}` from the run "
             "records in `docs/claims/runs/` and `docs/claims/tuning/`.", ""] + forest
    lines += [line for tier in v3 for line in rule_v3_section(tier, store, v3[tier])]
    lines += ["Continue a campaign (finished runs are reused by the hash of their run config) "
              "and regenerate:", "", "```bash"]
    lines += [_continue(t) for t in tiers] + ["fedtune claims report", "```", ""]
    lines += [HOW_TO_READ, "", "Update screening is **off** in every claim run (the papers ran "
              "none).", ""]
    for tier in tiers:
        lines += tier_section(tier, store, out, *evaluated[tier])
    out.write_text("\n".join(lines) + "\n")
    if readme is not None and readme.is_file():
        update_readme(readme, forest)
    return str(out)


def tier_rows(tier: str, store: Path) -> tuple[dict, list[dict], dict | None, dict]:
    """A tier's records, its claims' rows, and (tuned tiers) its rows at the papers' 0.01 and
    under each robustness check (check id -> {claim id: row})."""
    records = load_records(tier, store)
    rows = evaluate(tier, store, records)
    if tier not in reg.LR_GRID:
        return records, rows, None, {}
    at_paper_rate = {r["claim"].id: r for r in evaluate(tier, store, lr_mode="paper")}
    checks = {c.id: {r["claim"].id: r for r in evaluate(tier, store, check=c)}
              for c in reg.CHECKS.values()}
    return records, rows, at_paper_rate, checks


def later_text(rows: list[dict]) -> str:
    """How many of the claims without records were registered after the exploratory campaign
    (they run on the confirmatory seeds only)."""
    later = sum(r["claim"].id in reg.AFTER_EXPLORATORY and r["verdict"].verdict == cs.NOT_RUN
                for r in rows)
    return (f" ({later} of those without records registered after this campaign: they run on "
            "the confirmatory seeds only)" if later else "")


def verdict_counts(rows: list[dict]) -> str:
    """How many claims read each verdict, e.g. '8 inconclusive, 12 refuted'."""
    counts = Counter(row["verdict"].verdict for row in rows)
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def forest_section(tier: str, store: Path, out: Path, rows: list[dict],
                   at_paper_rate: dict | None, checks: dict, v3_rows: list[dict] | None = None
                   ) -> list[str]:
    """The report's first screen: every claim of the tier in one forest plot, and the count of
    each verdict. Once a claim has all its confirmatory seeds (``v3_rows``: ``evaluate_v3``'s),
    the headline is rule v3's, with its own figure, and the exploratory counts follow it in
    those words; until then, the exploratory headline alone."""
    words = {r["claim"].id: robustness_word(r, (at_paper_rate or {}).get(r["claim"].id), checks)
             for r in rows}
    png = store / f"{tier}-forest.png"
    title = f"Tier {tier}: {TIER_TITLE.get(tier, tier)}"
    if not forest_plot(rows, words, png, title):
        return []
    figure = png.relative_to(out.parent).as_posix()
    sensitive = sum("sensitive" in w for w in words.values())
    last_seed = max(max(r["seeds"], default=0) for r in rows)
    exploratory = (f"Tier `{tier}`, **exploratory** (seeds 0-{last_seed}, judged by the rule of "
                   f"{reg.VERDICT_RULE_DATE}, written after most of their runs "
                   f"had been seen), {len(rows)} claims: "
                   + verdict_counts(rows) + later_text(rows) + f"; {sensitive} of them "
                   "sensitive to the learning rate (the papers' 0.01 against the tuned rates) "
                   "or, where checked, to the papers' 100 rounds, by the exploratory rule's "
                   "words; another backbone not checked yet. ")
    if not any(r["tested"] for r in v3_rows or ()):
        return [f"![{tier} verdicts]({figure})", "", exploratory
                + confirmatory_line(tier, store) + " Each claim's numbers: the table and "
                "sections below.", ""]
    return confirmatory_headline(tier, store, out, v3_rows) + [
        "Beside them, " + exploratory[0].lower() + exploratory[1:]
        + f"Their figure: [{tier}-forest.png]({figure}). Each claim's numbers: the tables and "
        "sections below.", ""]


def confirmatory_headline(tier: str, store: Path, out: Path, v3_rows: list[dict]) -> list[str]:
    """Rule v3's headline: its forest plot (a figure of its own: the exploratory one stays what
    it was, beside it) and the count of each verdict over the tier's hypotheses, a claim whose
    runs are another's counted once."""
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    counted = [r for r in v3_rows if not r["claim"].same_as]
    words = {r["claim"].id: r["lr"][2] for r in v3_rows
             if r.get("lr") and r["lr"][2] in reg.ROBUSTNESS_WORDS}
    png = store / f"{tier}-forest-confirmatory.png"
    forest_plot(v3_rows, {i: f"{w} at 0.01" for i, w in words.items()}, png,
                f"Tier {tier}, confirmatory seeds {seeds[0]}-{seeds[-1]} (rule v3)")
    done = sum(r["tested"] for r in counted)
    at_paper = Counter(words[r["claim"].id] for r in counted if r["claim"].id in words)
    return [f"![{tier} confirmatory verdicts]({png.relative_to(out.parent).as_posix()})", "",
            f"Tier `{tier}`, **confirmatory** (seeds {seeds[0]}-{seeds[-1]}, judged by rule v3 "
            f"of {reg.RULE_V3_DATE}, written before any of their runs), {len(counted)} "
            f"hypotheses (a claim whose runs are another's counted once), {done} of them with "
            f"every confirmatory seed in: " + verdict_counts(counted) + "; at the papers' "
            "0.01, on the paired change: "
            + (", ".join(f"{n} {w}" for w, n in sorted(at_paper.items())) or "no word yet")
            + f"; {family_status(tier, v3_rows)}.", ""]


def confirmatory_progress(tier: str, store: Path) -> tuple[list, list] | None:
    """Rule v3's campaign: its planned runs (the claims whose arms have their rates) and those
    without a record yet; None while no arm is tuned."""
    try:
        plan = plan_runs([], tier, store=store, confirmatory=True)
    except SystemExit:
        return None
    done = records_by_hash(store / "runs" / tier)
    return plan, [s for s in plan if s.hash not in done]


def confirmatory_seeds_in(tier: str, store: Path) -> int:
    """How many of the tier's confirmatory seeds have every run of rule v3's campaign."""
    progress = confirmatory_progress(tier, store)
    if progress is None:
        return 0
    todo_seeds = {s.seed for s in progress[1]}
    return sum(seed not in todo_seeds for seed in reg.CONFIRMATORY_SEEDS[tier])


def confirmatory_line(tier: str, store: Path, claims_in: int = 0) -> str:
    """Where the confirmatory campaign stands, in the words the headline counts need
    (``claims_in``: how many hypotheses have every confirmatory seed)."""
    if tier not in reg.CONFIRMATORY_SEEDS:
        return ""
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    done = confirmatory_seeds_in(tier, store)
    return (f"**Confirmatory: {done} of {len(seeds)} seeds complete** (every run of the "
            f"campaign in on that seed; rule v3 of {reg.RULE_V3_DATE} judges seeds "
            f"{seeds[0]}-{seeds[-1]}; "
            + (f"{claims_in} hypotheses have all their confirmatory seeds, the confirmatory "
               "table gives each one's count)." if claims_in else
               "no hypothesis has all its confirmatory seeds yet, so no count above is "
               "confirmatory)."))


def rule_v3_section(tier: str, store: Path, v3_rows: list[dict]) -> list[str]:
    """Rule v3, part by part, with what it declares before the confirmatory runs: the seeds,
    the families and their members, the claims it leaves out, the papers' gaps it knows."""
    if tier not in reg.CONFIRMATORY_SEEDS:
        return []
    from fedtune_app.claims.planning import confirmatory_left_out, match_claims

    claims = match_claims([], tier)
    lines = [f"## Rule v3: the rule that judges the confirmatory seeds of tier `{tier}`", "",
             f"Written on {reg.RULE_V3_DATE}, before any run of the confirmatory seeds "
             f"(`RULE_V3` in the registry; git history shows it older than every record of "
             f"them). Why: {reg.RULE_V3_REASON} "
             + confirmatory_line(tier, store, sum(r["tested"] for r in v3_rows
                                                  if not r["claim"].same_as))
             + " The exploratory seeds below are judged by the earlier rule, in its words; "
             "rule v3 is not applied to them here.", ""]
    lines += [f"{i}. **{name}**: {text}." for i, (name, text) in enumerate(reg.RULE_V3, 1)]
    lines += ["", f"Planning numbers from the exploratory seeds: detectable difference "
              f"{reg.PLANNED_DETECTABLE[tier]:g} points (the gate's bound), smallest detectable "
              f"equivalence margin {reg.SMALLEST_DETECTABLE_MARGIN[tier]:g}, robustness band "
              f"+-{reg.ROBUST_BAND[tier]:g}.", "", "Families, declared with their members:", ""]
    checks = {f"{tier}: {c.id}": c for c in reg.CHECKS.values()}
    for name, members in reg.v3_families(tier).items():
        lines.append(f"- `{name}` ({len(members)} hypotheses): "
                     + ", ".join(f"`{m}`" for m in members) + "."
                     + (check_seeds_text(checks[name], tier) if name in checks else ""))
    same = [c for c in claims if c.same_as]
    lines += ["- One hypothesis each, counted once: " + "; ".join(
        f"`{c.id}` is `{c.same_as}` ({c.same_reason})" for c in same) + "." if same else "",
        "", "Left out of the confirmatory campaign: "
        + "; ".join(confirmatory_left_out(claims, tier, store)) + ".", "",
        "The papers' AllLarge - AllSmall, the denominator of the paper's side of the effect "
        "fraction: " + "; ".join(
            f"`{st.id}` {st.paper_large - st.paper_small:.2f} points ({st.paper_gap})"
            if st.paper_large is not None and st.paper_small is not None
            else f"`{st.id}` paper's gap not known ({st.paper_gap or 'no number in the registry'})"
            for st in SETTINGS.values() if tier in st.tiers) + ".",
        "", f"The campaign: `fedtune claims run --tier {tier} --dry-run` lists its runs and "
        "core-hours (after `fedtune claims tune`, whose rates it runs at).", ""]
    return lines + gate_table(tier, store, v3_rows) + confirmatory_table(tier, v3_rows)


def gate_table(tier: str, store: Path, v3_rows: list[dict]) -> list[str]:
    """Each setting of the confirmatory claims with rule v3's gate on its confirmatory seeds,
    beside the gap it was calibrated to on validation (the tuning seeds)."""
    gates = {}
    for row in v3_rows:
        gates |= row.get("gaps", {})
    validation = validation_gaps(tier, store) if tier in reg.LR_GRID else {}
    need = len(reg.CONFIRMATORY_SEEDS[tier])
    lines = [f"Rule v3's gate, setting by setting: AllLarge - AllSmall (a rank setting: FedIT "
             f"at its highest rank - its lowest) on the validation split (the tuning seeds, "
             f"each arm at its chosen rate: what the setting was calibrated on) and on the "
             f"confirmatory seeds (95%, seeds and test set); a setting passes "
             f"when all {need} seeds are in and the lower end is above "
             f"{reg.PLANNED_DETECTABLE[tier]:g}.", "",
             "| setting | validation | confirmatory | seeds | gate |", "|---|---|---|---|---|"]
    for setting in (st for st in SETTINGS if st in gates):
        gap, passes, seeds = gates[setting]
        value = validation.get(setting, (None,))[0]
        lines.append(f"| `{setting}` | {'-' if value is None else f'{value:.2f}'} | "
                     f"{'-' if gap is None else ci_text(gap)} | {len(seeds)} of {need} | "
                     + ("waiting for seeds" if passes is None else
                        "**passes**" if passes else "**fails**: no verdict in it") + " |")
    return lines + [""]


def check_seeds_text(check, tier: str) -> str:
    """A robustness check runs on its own seeds 0..seeds-1, which are exploratory on a tier
    with confirmatory seeds: said beside its family, which no confirmatory run serves yet."""
    return (f" Its runs (`fedtune claims run --tier {tier} --check {check.id}`) are on its own "
            f"seeds 0-{check.seeds - 1}, exploratory seeds planned with the exploratory rule: "
            "no confirmatory run serves this family, and its words stay exploratory.")


def confirmatory_table(tier: str, rows: list[dict]) -> list[str]:
    """Every claim of the tier as rule v3 judges it on the confirmatory seeds (``rows``:
    ``evaluate_v3``'s)."""
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    lines = [f"### Confirmatory (rule v3), tier `{tier}`", "",
             f"Seeds {seeds[0]}-{seeds[-1]}, judged by rule v3 as stated above; "
             + family_status(tier, rows) + ". Difference: mean with the test's interval "
             "(seeds and test set); / gap: ours over the setting's AllLarge - AllSmall, the "
             "paper's over its own; drift: the difference's trend over the last window (95%, "
             "seeds and the test set's closed-form error of the trend; *seeds only* where "
             "the records keep no per-example results of both windows) with the one-sided p "
             "of its move towards the null; at 0.01: the paired change to the papers' rate "
             "(95%) and its word.", "",
             "| claim | seeds | difference | / gap | p | Holm p | verdict | drift | at 0.01 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        v = row["verdict"]
        drift = "-"
        if row["drift"]:
            p, trend, how = row["drift"]
            drift = (f"{ci_text(trend)} (p {p_text(p)}"
                     + ("; *seeds only*)" if how == TREND_SEEDS_ONLY else ")"))
        lr = row.get("lr")
        verdict = f"**{v.verdict}**" + (f" ({v.reason})" if v.reason else "")
        lines.append(f"| `{row['claim'].id}` | {len(row['seeds'])} of {row['need']} | "
                     f"{ci_text(v.difference)} | {effect_text(row)[1]} | {p_text(v.p)} | "
                     f"{p_text(v.p_holm)} | {verdict} | {drift} | "
                     + (f"{ci_text(lr[0])}: {lr[2]}" if lr else "-") + " |")
    return lines + [""]


def decomposition_section(tier: str, records: dict, seeds=range(MAX_SEEDS),
                          which: str = "") -> list[str]:
    """Each claim of ``reg.DECOMPOSITIONS`` beside its parts, on the seeds (of ``seeds``) all
    of them have: the parts' paired differences add up to the whole's seed by seed, each with
    its interval (seeds and test set, closed form: rule v3's ``interval_v3``). ``which``
    names the seeds in the text, e.g. "confirmatory"."""
    from fedtune_app.claims.verdicts_v3 import interval_v3

    seeds, lines = list(seeds), []
    for whole_id, parts in reg.DECOMPOSITIONS.items():
        whole = reg.CLAIMS[whole_id]
        if tier not in tiers_of(whole):
            continue
        claims = [("the whole", whole)] + [(label, reg.CLAIMS[i]) for label, i in parts]
        terms = tuple(t for _, c in claims for t in c.terms)
        common = seeds_with(terms, records, seeds)
        lines += [f"### `{whole_id}` in parts", "",
                  f"{whole.sentence}, taken apart on the {which + ' ' if which else ''}seeds "
                  f"every arm has ({len(common)} of {len(seeds)}: {seeds[0]}-{seeds[-1]}); the "
                  f"paper's difference is {whole.paper_difference:+.2f} points.", "",
                  "| part | claim | difference (points, 95%: seeds and test set) |",
                  "| --- | --- | --- |"]
        for label, c in claims:
            if len(common) < 2:
                cell = "not yet: fewer than 2 seeds that every arm has"
            else:
                iv = interval_v3(c.terms, tier, records, common, 0.95)[0]
                cell = f"{iv.mean:+.2f} ({iv.low:+.2f} to {iv.high:+.2f})"
            lines.append(f"| {label} | `{c.id}` | {cell} |")
        lines.append("")
    return lines


def backbone_effect_text(store: Path) -> str:
    """How far this machine's stand-ins move a tuning run of the base grid
    (``scripts/backbone_effect.py``), when measured: the share of a widened comparison that is
    the backbone's, not the rate's."""
    path = store / "tuning" / "backbone-effect.json"
    if not path.exists():
        return ""
    shifts = {k: v["here-minus-stored"] for k, v in json.loads(path.read_text()).items()}
    return (" The rungs beyond the base grid ran on the committed stand-ins "
            "(docs/claims/backbones/), the base grid's records on the files of earlier machines: "
            f"run again on the committed files, {len(shifts)} base-grid arms moved by "
            f"{min(shifts.values()):+.2f} to {max(shifts.values()):+.2f} points "
            "(`docs/claims/tuning/backbone-effect.json`, `scripts/backbone_effect.py`).")


def rates_table(tier: str, widened: dict, exploratory: dict, store: Path) -> list[str]:
    """Each arm's validation means over its widened grid, its exploratory and confirmatory rate,
    and why a rate at its grid's edge stays there."""
    ladder = [x for x in reg.LR_LADDER[tier]
              if any(x in c.grid or x in c.next_rates for c in widened.values())]
    lines = [f"### Learning rates of tier `{tier}`", "",
             f"Exploratory seeds: {reg.LR_RULE}, over {_grid(tier)}. Confirmatory seeds "
             f"(rule v3, written {reg.LR_WIDENING_DATE}): {reg.LR_WIDENING_RULE}. Validation "
             "means (points, tuning seeds in); `-`: not run; `...`: waits for its runs."
             + backbone_effect_text(store), "",
             "| setting | arm | exploratory lr | confirmatory lr | "
             + " | ".join(f"lr {x:g}" for x in ladder) + " | best validation round | edge |",
             "|---|---|---|---|" + "---|" * len(ladder) + "---|---|"]
    for (st, arm), ch in widened.items():
        cells = " | ".join(
            f"{ch.means[x]:.2f} ({ch.seeds[x]})" + (f", {ch.rejected[x]} rejected"
                                                    if ch.rejected.get(x) else "")
            if x in ch.means else "..." if x in ch.next_rates else "-" for x in ladder)
        old = exploratory[st, arm].lr
        lines.append(f"| `{st}` | {arm} | {'-' if old is None else f'{old:g}'} | "
                     f"{'-' if ch.lr is None else f'{ch.lr:g}'} | {cells} | "
                     f"{ch.best_round or '-'} | {ch.edge or '-'} |")
    return lines + [""]


def mechanism_sections(tier: str, store: Path, records: dict) -> list[str]:
    """The decompositions and the per-model tables of Table 1's settings, on the confirmatory
    seeds at their widened rates where the tier has them (the claims they serve run there), else
    on ``records``."""
    if tier in reg.CONFIRMATORY_SEEDS:
        seeds = reg.CONFIRMATORY_SEEDS[tier]
        records, which = load_records(tier, store, seeds=seeds, widened=True), "confirmatory"
    else:
        seeds, which = range(MAX_SEEDS), ""
    return decomposition_section(tier, records, seeds, which) + [
        line for setting in TABLE1_SETTINGS
        for line in per_model_section(tier, records, seeds, setting, planned_arms(setting))]


def tier_section(tier: str, store: Path, out: Path, records: dict, rows: list[dict],
                 at_paper_rate: dict | None, checks: dict) -> list[str]:
    claims = [r["claim"] for r in rows]
    choices = (tuned_rates(tier, store, tier_pairs(claims), widened=True)
               if tier in reg.LR_GRID else {})
    lines = [f"## Tier `{tier}`: {TIER_TITLE.get(tier, tier)}", "", TIER_TEXT.get(tier, ""), ""]
    if not records:
        lines += [f"No records yet: every claim reads \"{cs.NOT_RUN}\". Command: "
                  f"`{_continue(tier)}`.", ""]
    lines += (verdict_rows(rows, at_paper_rate, checks) + [""] + tier_summary(rows, records)
              + mechanism_sections(tier, store, records) + tier_cost(tier, records, store))
    if choices:
        lines += rates_table(tier, choices, tuned_rates(tier, store, tier_pairs(claims)), store)
    if records:
        lines += [f"### Settings of tier `{tier}`", ""]
        for st in SETTINGS:
            if tier not in SETTINGS[st].tiers:
                continue
            arms = sorted({a for (s, a, _) in records if s == st}, key=list(ARMS).index)
            own = [a for a in arms if a not in (SETTINGS[st].reference, SETTINGS[st].small)]
            if not own:  # only the gate's runs, shared with another setting: shown there
                continue
            gap, seeds = setting_gap(st, records)
            lines += [f"#### `{st}`", "", SETTINGS[st].shape + ".", ""]
            lines.append("AllLarge - AllSmall (primary metric, paired): "
                         + (f"{ci_text(gap)} points over seeds {', '.join(map(str, seeds))}."
                            if gap else "not run on a common seed yet.")
                         + (f" The tier's design target, at least {GAP_TARGET:g} points: "
                            + ("met." if gap.mean >= GAP_TARGET else "**not met**: the "
                               "setting is not discriminative by it, and its claims say so.")
                            if gap and tier in reg.TIER_SEEDS else ""))
            png = store / f"{tier}-{st}.png"
            if plot_setting(tier, st, records, png):
                lines += ["", f"![{st}]({png.relative_to(out.parent).as_posix()})"]
            lines += [""] + ARM_HEADER
            for arm in arms:
                rs = [records[k] for k in sorted(records) if k[0] == st and k[1] == arm]
                lines.append(arm_row(arm, rs, choices.get((st, arm))))
            lines.append("")
    if tier == "cpu":
        lines += owner_test_section(store)
    if records or tier in reg.LR_GRID:  # the mini tier shows its plan before any record
        lines += [f"### Claims of tier `{tier}`", ""]
        for row in rows:
            lines += claim_section(row, tier, choices,
                                   (at_paper_rate or {}).get(row["claim"].id))
    if records:
        lines += [f"### Records of tier `{tier}` and the code that made them", ""]
        lines += older_code_section(tier, records)
        lines += checkpoint_section(tier, records)
    return lines


DETECTABLE_TARGET = 3.0  # points: the median detectable difference a tier should reach
SECONDS_TARGET = 120  # a run's budget on one idle core
TIER_HOURS_TARGET = 12  # core-hours: every claim run of a tier at its seed count


def tier_summary(rows: list[dict], records: dict) -> list[str]:
    """How far the tier's campaign is, and its two cost targets: the median detectable
    difference over the claims with every seed in, and the slowest arm's mean run time (with a
    fixed seed count: how many runs, and which arms on average, exceed the run-time target)."""
    if not records:
        return []
    done = [row["verdict"].detectable for row in rows  # a claim equal to another: once
            if row["tested"] and not row["claim"].same_as
            and math.isfinite(row["verdict"].detectable)]
    per_arm: dict = {}
    seen: set = set()  # a run shared by settings (AllLarge) counts under the first
    order = list(SETTINGS)
    for (st, arm, _), r in sorted(records.items(), key=lambda kv: order.index(kv[0][0])):
        if r.get("file", id(r)) not in seen:
            seen.add(r.get("file", id(r)))
            per_arm.setdefault((st, arm), []).append(run_cost(r))
    means = sorted(((float(np.mean(v)), k) for k, v in per_arm.items()), reverse=True)
    # the cost targets are the tiers' with a fixed seed count (mini), built to meet them
    targets = bool(rows) and rows[0]["tier"] in reg.TIER_SEEDS
    tier = rows[0]["tier"] if rows else ""
    text = ((f"Exploratory campaign (seeds 0-{MAX_SEEDS - 1}): " if tier in reg.CONFIRMATORY_SEEDS
             else "Campaign: ") + verdict_counts(rows) + ". ")
    if done:
        text += (f"Median detectable difference over the {len(done)} claims with every seed "
                 f"in: {float(np.median(done)):.2f} points"
                 + (f" (target at most {DETECTABLE_TARGET:g}). " if targets else ". "))
    slow, (slow_setting, slow_arm) = means[0]
    text += f"Slowest arm: {slow_arm} in `{slow_setting}`, {slow:.0f} s a run on average"
    if targets:
        runs = [c for v in per_arm.values() for c in v]
        over = [f"{arm} in `{st}` {mean:.0f} s" for mean, (st, arm) in means
                if mean > SECONDS_TARGET]
        text += (f" (target at most {SECONDS_TARGET} s on one idle core): "
                 f"{sum(c > SECONDS_TARGET for c in runs)} of the {len(runs)} runs over it"
                 + ("; arms over it on average: " + ", ".join(over) if over else "")
                 + ". CPU seconds where a record keeps them, else wall seconds.")
    else:
        text += " (CPU seconds where a record keeps them, else wall seconds)."
    return [text, ""]


def tier_cost(tier: str, records: dict, store: Path = STORE) -> list[str]:
    """A tier's core-hours against its budget: its distinct claim runs in, those still to do at
    the stored seconds of the same arm, and its tuning runs (tiers with a fixed seed count)."""
    if tier not in reg.TIER_SEEDS:
        return []
    spent = {r["file"]: run_cost(r) for r in records.values()}  # a shared run counts once
    # the distinct runs of the tier's claims; which runs share does not depend on the rate
    plan = plan_runs([], tier, store=store, lr_mode="paper")
    todo = [s for s in plan if (s.setting, s.arm, s.seed) not in records]
    known, unknown = cost_to_do(todo, store)
    tuning = sum(run_cost(json.loads(p.read_text()))
                 for p in (store / "tuning" / tier).glob("*.json"))
    seeds = "exploratory seeds" if tier in reg.CONFIRMATORY_SEEDS else "seeds"
    return [f"Cost ({seeds} 0-{MAX_SEEDS - 1}): the {len(spent)} claim runs in took "
            f"{sum(spent.values()) / 3600:.1f} core-hours; the {len(todo)} still to do, about "
            f"{known / 3600:.1f} more at the stored seconds of the same arm"
            + (f" ({unknown} runs of arms with no stored run not counted)" if unknown else "")
            + f"; target: all of them in about {TIER_HOURS_TARGET} core-hours. The tuning runs "
            f"so far: {tuning / 3600:.1f} core-hours." + confirmatory_cost(tier, store), ""]


def confirmatory_cost(tier: str, store: Path) -> str:
    """Where rule v3's campaign stands in runs and core-hours (its claims whose arms have their
    rates; the others join it once tuned)."""
    progress = confirmatory_progress(tier, store) if tier in reg.CONFIRMATORY_SEEDS else None
    if progress is None:
        return ""
    plan, todo = progress
    known, unknown = cost_to_do(todo, store)
    seeds = reg.CONFIRMATORY_SEEDS[tier]
    return (f" The confirmatory campaign (seeds {seeds[0]}-{seeds[-1]}, the claims whose arms "
            f"have their rates): {len(plan) - len(todo)} of {len(plan)} runs in, the rest about "
            f"{known / 3600:.1f} core-hours"
            + (f" ({unknown} runs of arms with no stored run not counted)" if unknown else "")
            + f" (`fedtune claims run --tier {tier} --dry-run`; at the papers' 0.01: "
            "`--lr paper --dry-run`).")


def update_readme(readme: Path, forest: list[str]) -> None:
    """The README's claims block: the forest plot and the count of each verdict."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    # the figure's path from the README's folder, not the report's
    forest = [line.replace("](claims/", "](docs/claims/") for line in forest]
    body = [f"Generated by `fedtune claims report` at code commit `{code_commit()}` "
            "(difference in accuracy points, claimed side minus the other; every number in "
            "[docs/claims.md](docs/claims.md)).", ""] + forest
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(body).rstrip() + "\n" + README_END
                      + tail)
