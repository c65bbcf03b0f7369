"""HeteroTune's pooled Table 1 setting model size by model size: each arm's accuracy per model
group and their average beside the paper's Table 1 (CIFAR-10), in the paper's ranking, with each
arm's effect against Homo as a fraction of the setting's AllLarge - AllSmall gap."""

from __future__ import annotations

import numpy as np

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.claim_text import ci_text
from fedtune_app.claims.planning import tier_pairs
from fedtune_app.claims.store import MAX_SEEDS, primary_points, run_config
from fedtune_app.claims.verdicts import gap_terms, paired_differences, seeds_with

POOLED = "heterotune-pooled"
TABLE1_SETTINGS = (POOLED, "heterotune-pooled-dirichlet")  # Table 1's design, its partition check
PAPER_SIZES = ("ViT-T", "ViT-S", "ViT-B", "ViT-L")  # the paper's models, smallest first
# the arms that take HeteroTune's mechanism apart (no Table 1 row): adapter-Homo, Table 4's
MECHANISM = {"heterotune-within-group": ("adapter-Homo", None)} | {
    arm: (f"{name} (Table 4)", avg) for arm, (name, avg) in reg.HETERO_T4_CIFAR10.items()}


def group_labels(tier: str, setting: str) -> list[str]:
    """Each model group's column header, smallest first, from the setting's resolved keys (its
    preset's model-group-args): depth x width, after the paper's name when the setting has its
    four sizes."""
    from fedtune_app.methods import resolve_config

    groups = resolve_config(run_config(tier, setting, reg.HETERO_REFERENCE, 0)).model.groups
    names = PAPER_SIZES if len(groups) == len(PAPER_SIZES) else [""] * len(groups)
    labels = []
    for name, group in zip(names, groups):
        args = dict(a.split("=", 1) for a in group["model-args"].split(",") if "=" in a)
        shape = (f"{args['depth']}x{args['embed_dim']}" if {"depth", "embed_dim"} <= set(args)
                 else group["model"])
        labels.append(f"{name} ({shape})" if name else shape)
    return labels


def group_points(record: dict) -> dict[int, float]:
    """Model group -> its primary metric in points, from which test examples the group's model
    got right in the primary metric's evaluations (``test-correct``): per evaluation the mean
    over the test set's strata, as the headline reads domains, then over the evaluations. A
    one-model arm has its one group (AllLarge: the largest); {} where the record keeps none."""
    from fedtune_app.apps.evaluation import unpack_correct

    evaluations = record.get("test-correct") or [{}]
    return {int(g): 100 * float(np.mean([np.mean([unpack_correct(v).mean()
                                                  for v in ev[g].values()])
                                         for ev in evaluations]))
            for g in evaluations[0]}


def planned_arms(setting: str) -> set[str]:
    """The arms some registered claim runs in ``setting`` (its gate's included)."""
    return {arm for s, arm in tier_pairs(reg.CLAIMS.values()) if s == setting}


def per_model_section(tier: str, records: dict, seeds=range(MAX_SEEDS),
                      setting: str = POOLED, arms: set[str] | None = None) -> list[str]:
    """The per-model table of ``setting`` on ``seeds`` (``records``: ``load_records``'s, e.g.
    the confirmatory seeds' at their widened rates): one row per arm (of ``arms`` where given),
    the paper's Table 1 rows first in the paper's ranking (each comparator as the claims run
    it), then the mechanism's arms; an arm without a record on those seeds reads "no records
    yet"."""
    st = reg.SETTINGS[setting]
    if tier not in st.tiers:
        return []
    seeds = list(seeds)
    records = {k: r for k, r in records.items() if k[0] == setting and k[2] in seeds}
    table1 = {reg.POOLED_COMPARATORS.get(base, base): row
              for base, row in reg.HETERO_T1_CIFAR10.items()}
    paper_rank = {arm: i for i, arm in enumerate(table1, 1)}
    paper_homo = table1[reg.HETERO_REFERENCE][3]
    paper_gap = st.paper_large - st.paper_small
    runs = {arm: [records[setting, arm, s] for s in seeds if (setting, arm, s) in records]
            for arm in [*table1, *MECHANISM] if arms is None or arm in arms}
    avg = {arm: cs.t_interval([primary_points(r) for r in rs]) for arm, rs in runs.items() if rs}
    ranked = sorted((a for a in table1 if a in avg), key=lambda a: -avg[a].mean)
    gap_seeds = seeds_with(gap_terms(setting), records, seeds)
    gap = float(np.mean(paired_differences(gap_terms(setting), records, gap_seeds))) \
        if gap_seeds else None
    labels = group_labels(tier, setting)
    lines = [f"### `{setting}` model size by model size, beside the paper's Table 1", "",
             "Each arm's primary metric (points, mean ± 95% half-width over the seeds with a "
             f"record, of {seeds[0]}-{seeds[-1]}: Student t over the seeds alone) for each "
             "model group, smallest first (depth x width from the setting's preset), and their "
             "average (the headline; HeteroTune's Avg); a one-model arm (AllLarge, AllSmall) under "
             "its one size. Beside it the paper's Table 1 CIFAR-10 row: smallest (ViT-T), largest "
             "(ViT-L) and Avg; the paper prints no ViT-S or ViT-B column, and for AllLarge and "
             "AllSmall only Avg. Rows in the paper's ranking by Avg, each comparator as the claims "
             "run it"
             + (", then the arms that take the mechanism apart (Table 4's ablations beside Table"
                " 4's Avg)" if MECHANISM.keys() & runs.keys() else "")
             + ". Rank: by Avg among the Table 1 arms with records, here / in the paper. vs "
             "Homo: the paired difference in Avg (95%, seeds alone), then it over the setting's "
             "AllLarge - AllSmall ("
             + (f"{gap:.2f} points over {len(gap_seeds)} seeds" if gap is not None
                else "no common seed yet")
             + f") beside the paper's over its own ({st.paper_large:.2f} - "
             f"{st.paper_small:.2f} = {paper_gap:.2f}).", "",
             "| arm | seeds | " + " | ".join(labels) + " | Avg | paper: smallest / largest / "
             "Avg | rank here / in paper | vs Homo (points) | vs Homo / gap (paper) |",
             "|---|---|" + "---|" * len(labels) + "---|---|---|---|---|"]
    for arm, rs in runs.items():
        name, paper_avg = (table1[arm][0], table1[arm][3]) if arm in table1 else MECHANISM[arm]
        paper = ("-" if paper_avg is None else f"- / - / {paper_avg:.2f}" if arm not in table1
                 else " / ".join("-" if x is None else f"{x:.2f}" for x in table1[arm][1:]))
        paper_fraction = ("-" if paper_avg is None
                          else f"{(paper_avg - paper_homo) / paper_gap:+.2f}")
        sizes, mean, effect = ["no records yet"] + ["-"] * (len(labels) - 1), "-", None
        if rs:
            per_group = [group_points(r) for r in rs]
            sizes = [ci_text(cs.t_interval(v)) if v else "-"
                     for v in ([p[g] for p in per_group if g in p] for g in range(len(labels)))]
            mean = ci_text(avg[arm])
            versus = ((1.0, setting, arm), (-1.0, setting, reg.HETERO_REFERENCE))
            both = seeds_with(versus, records, seeds)
            if both and arm != reg.HETERO_REFERENCE:
                effect = cs.t_interval(paired_differences(versus, records, both))
        versus_homo = (["the reference"] * 2 if arm == reg.HETERO_REFERENCE else
                       [ci_text(effect), ("-" if effect is None or not gap else
                                          f"{effect.mean / gap:+.2f}") + f" ({paper_fraction})"])
        rank = f"{ranked.index(arm) + 1 if arm in ranked else '-'} / {paper_rank.get(arm, '-')}"
        lines.append(f"| {name}: `{arm}` | {len(rs)} | " + " | ".join(sizes)
                     + f" | {mean} | {paper} | {rank} | " + " | ".join(versus_homo) + " |")
    return lines + [""]
