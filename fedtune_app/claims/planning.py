"""Planning a campaign: which claims, which (setting, arm, seed) runs in which order, at which
learning rate (chosen on validation by the registry's rule), and the records that answer them."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.entries import Claim
from fedtune_app.claims.registry import (
    ARMS,
    claim_arms,
    claim_seeds,
    tiers_of,
)
from fedtune_app.claims.store import (
    LR_MODES,
    MAX_SEEDS,
    STORE,
    RunSpec,
    curve_points,
    hash_or_none,
    primary_points,
    records_by_hash,
    run_config,
    tuning_config,
)


def match_claims(patterns: list[str], tier: str) -> list[Claim]:
    """Claims named by id or glob (all claims of the tier when none), in priority order.

    A glob keeps the claims it matches that have the tier ('heterotune-*' on the CPU tier skips
    the GPU-only LLaMA rows); an id, or a glob none of whose claims has the tier, is an error.
    """
    available = [c for c in reg.CLAIMS.values() if tier in tiers_of(c)]
    if not patterns:
        chosen = available
    else:
        chosen = []
        for p in patterns:
            hits = [c for c in reg.CLAIMS.values() if fnmatch.fnmatch(c.id, p)]
            if not hits:
                raise SystemExit(f"claims: no claim matches {p!r}; `fedtune claims list` "
                                 "shows them")
            in_tier = [c for c in hits if c in available]
            if not in_tier:
                has = "; ".join(f"{c.id} has: {', '.join(tiers_of(c)) or 'none'}" for c in hits)
                raise SystemExit(f"claims: {p!r} matches no claim with a {tier!r} tier ({has})")
            chosen += in_tier
    chosen = list(dict.fromkeys(chosen))
    return sorted(chosen, key=lambda c: (c.priority, list(reg.CLAIMS).index(c.id)))


def tier_pairs(claims: list[Claim]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(p for c in claims for p in claim_arms(c)))


def arm_rates(tier: str, pairs, lr_mode: str = "tuned", store: Path = STORE,
              widened: bool = False) -> dict:
    """(setting, arm) -> the rate its claim runs use: None on a tier without a grid (its own
    keys' rate), the papers' 0.01 with ``lr_mode='paper'``, else the tuned choice (missing
    where the tuning runs are not all in; ``widened``: rule v3's, the confirmatory seeds')."""
    if lr_mode not in LR_MODES:
        raise SystemExit(f"claims: --lr {lr_mode!r}: expected one of {', '.join(LR_MODES)}")
    if tier not in reg.LR_GRID:
        return {p: None for p in pairs}
    if lr_mode == "paper":
        return {p: reg.PAPER_LR for p in pairs}
    choices = tuned_rates(tier, store, pairs, widened)
    return {p: choices[p].lr for p in pairs if choices[p].lr is not None}


def plan_runs(patterns: list[str] = (), tier: str = "cpu", seeds: int | None = None,
              store: Path = STORE, extra: dict | None = None,
              arms: list[str] | None = None, lr_mode: str = "tuned",
              data_dirs: dict | None = None, confirmatory: bool = False) -> list[RunSpec]:
    """Every distinct run the claims need, in campaign order: priority blocks, seed-major within
    a block (seed 0 of every arm, then seed 1, ...), the gate's arms first in each seed.
    ``seeds``: 0..seeds-1 for every claim (default: each claim's fixed count on the tier).
    ``arms``: only these arm labels (e.g. the gate's arms of every seed first, or one share of
    the campaign per process or machine). On a tier that tunes rates, each arm runs at its
    chosen rate (``lr_mode='paper'``: at 0.01); an arm not tuned yet is an error.
    ``data_dirs``: dataset -> its ``data-dir``, set on the runs of that dataset only (the paper
    tier reads NICO++ and DomainNet from two folders).
    ``confirmatory``: rule v3's campaign (``confirmatory_claims``) on the tier's confirmatory
    seeds (the first ``seeds`` of them when given), the README's findings first."""
    _check_arms(arms)
    if "client-engine" in (extra or {}):  # the report would never read those records
        raise SystemExit("claims: --set client-engine makes records the report does not read; "
                         "a tier's engine is store.CLIENT_ENGINE, part of every run's key")
    data_dirs = data_dirs or {}
    runs: dict[str, RunSpec] = {}
    claims = match_claims(list(patterns), tier)
    numbers = range(MAX_SEEDS)
    if confirmatory:
        claims, numbers = confirmatory_claims(claims, tier), reg.CONFIRMATORY_SEEDS[tier]
    rates = arm_rates(tier, tier_pairs(claims), lr_mode, store, widened=confirmatory)
    if confirmatory:  # a claim whose arms' widened rates are not all chosen waits; others run
        claims = [c for c in claims if all(p in rates for p in claim_arms(c))]
    untuned = [p for p in tier_pairs(claims) if p not in rates and (not arms or p[1] in arms)]
    if untuned:
        raise SystemExit(f"claims: no learning rate chosen yet for {len(untuned)} arm(s) of tier "
                         f"{tier!r} (e.g. {untuned[0][1]} in {untuned[0][0]}): run `fedtune "
                         f"claims tune --tier {tier}` first, or `--lr paper` for the papers' "
                         "0.01")
    for block in campaign_blocks(claims, confirmatory):
        pairs = tier_pairs(block)
        need = {p: max((seeds or claim_seeds(c, tier)) for c in block if p in claim_arms(c))
                for p in pairs}
        for k, seed in enumerate(numbers[:max(need.values())]):
            for setting, arm in pairs:
                if k < need[setting, arm] and (not arms or arm in arms):
                    keys = run_config(tier, setting, arm, seed, rates[setting, arm])
                    keys |= extra or {}
                    if keys.get("dataset") in data_dirs:
                        keys["data-dir"] = data_dirs[keys["dataset"]]
                    spec = RunSpec(tier, setting, arm, seed, keys)
                    runs.setdefault(spec.hash, spec)
    local = sorted({s.keys.get("dataset") for s in runs.values()} & set(LOCAL_DATASETS))
    if "data-dir" in (extra or {}) and len(local) > 1:
        raise SystemExit(f"claims: --set data-dir gives one folder to the runs of "
                         f"{' and '.join(local)}; give each its own: "
                         + " ".join(f"--data-dir {d}=DIR" for d in local))
    return list(runs.values())


def campaign_blocks(claims: list[Claim], confirmatory: bool = False) -> list[list[Claim]]:
    """The claims in the blocks a campaign runs one after another (seed-major inside each):
    by priority; the confirmatory campaign first runs the README's findings one by one
    (``CONFIRMATORY_ORDER``), then the others by priority."""
    first = [[c] for i in (reg.CONFIRMATORY_ORDER if confirmatory else ())
             for c in claims if c.id == i]
    rest = [c for c in claims if not confirmatory or c.id not in reg.CONFIRMATORY_ORDER]
    return first + [[c for c in rest if c.priority == p]
                    for p in sorted({c.priority for c in rest})]


def confirmatory_claims(claims: list[Claim], tier: str) -> list[Claim]:
    """Rule v3's campaign among ``claims``: not a claim this tier cannot show
    (``registry.cannot_show``), not one whose confirmatory seeds wait (``CONFIRMATORY_WAITS``)."""
    if tier not in reg.CONFIRMATORY_SEEDS:
        raise SystemExit(f"claims: tier {tier!r} has no confirmatory seeds (tiers with them: "
                         f"{', '.join(reg.CONFIRMATORY_SEEDS)})")
    return [c for c in claims if not reg.cannot_show(c, tier) and not reg.confirmatory_waits(c)]


def confirmatory_left_out(claims: list[Claim], tier: str, store: Path = STORE) -> list[str]:
    """The claims the confirmatory campaign leaves out, each with why."""
    out = []
    rates = arm_rates(tier, tier_pairs(claims), store=store, widened=True)
    for c in claims:
        untuned = [p for p in claim_arms(c) if p not in rates]
        if reg.cannot_show(c, tier):
            out.append(f"{c.id}: margin {c.margin:g} under the {tier} tier's smallest detectable "
                       f"margin {reg.SMALLEST_DETECTABLE_MARGIN[tier]:g} (this tier cannot "
                       "show it)")
        elif why := reg.confirmatory_waits(c):
            out.append(f"{c.id}: waits ({why})")
        elif untuned:
            out.append(f"{c.id}: waits for the widened rate of "
                       + ", ".join(f"{arm} in {setting}" for setting, arm in untuned)
                       + " (`fedtune claims tune`)")
    return out


# the data sets read from a local 'data-dir' (fedtune_app/data/sources.py)
LOCAL_DATASETS = ("domainnet", "nico++")


def parse_data_dirs(given: list[str]) -> dict[str, str]:
    """``--data-dir DATASET=DIR`` options -> {dataset: dir}."""
    out = {}
    for item in given:
        name, sep, folder = item.partition("=")
        if not sep or name not in LOCAL_DATASETS or not folder:
            raise SystemExit(f"claims: --data-dir {item!r}: expected DATASET=DIR with DATASET "
                             f"one of {', '.join(LOCAL_DATASETS)}")
        out[name] = folder
    return out


def _check_arms(arms) -> None:
    unknown = sorted(set(arms or ()) - set(ARMS))
    if unknown:
        raise SystemExit(f"claims: no arm {', '.join(map(repr, unknown))} (arms: "
                         f"{', '.join(ARMS)})")


# ---------------------------------------------------------------- learning rates

@dataclass(frozen=True)
class RateChoice:
    """One arm's rate in one setting: ``means`` (rate -> mean primary metric on validation over
    the tuning seeds in, points), ``lr`` by the registry's rule once every rate of its grid has
    every tuning seed (else None), ``best_round``: the round of the chosen rate's highest mean
    validation curve (the report reads the claim runs' test accuracy there). Widened (rule v3):
    ``grid`` the rates the choice is made over, ``next_rates`` the rungs it still waits for,
    ``edge`` why a choice at its grid's edge was not widened further (None: inside),
    ``rejected``: rate -> replies rejected over its tuning runs (not finite: it diverged)."""

    lr: float | None
    means: dict = field(default_factory=dict)
    seeds: dict = field(default_factory=dict)  # rate -> tuning seeds in
    best_round: int | None = None
    grid: tuple = ()
    next_rates: tuple = ()
    edge: str | None = None
    rejected: dict = field(default_factory=dict)


def choose_rate(means: dict) -> float:
    """``LR_RULE``: the highest mean; means equal to 0.01 points go to the smaller rate."""
    rounded = {lr: round(m, 2) for lr, m in means.items()}
    top = max(rounded.values())
    return min(lr for lr, m in rounded.items() if m == top)


def plan_tuning(patterns: list[str] = (), tier: str = "mini",
                arms: list[str] | None = None, store: Path = STORE,
                widened: bool = True) -> list[RunSpec]:
    """The tuning runs the claims need now: each (setting, arm) at each rate of the grid on each
    tuning seed, arm by arm; ``widened`` (rule v3): and the next rung of the ladder of each arm
    whose choice sits at its grid's edge (``tuned_rates``; a campaign plans again once those
    are in)."""
    if tier not in reg.LR_GRID:
        raise SystemExit(f"claims: tier {tier!r} has no learning-rate grid (tiers that tune: "
                         f"{', '.join(reg.LR_GRID)}); it runs {reg.PAPER_LR:g} untuned")
    _check_arms(arms)
    runs: dict[str, RunSpec] = {}
    pairs = [p for p in tier_pairs(match_claims(list(patterns), tier))
             if not arms or p[1] in arms]
    rates = {p: reg.LR_GRID[tier] for p in pairs}
    if widened:
        choices = tuned_rates(tier, store, pairs, widened=True)
        rates = {p: (*choices[p].grid, *choices[p].next_rates) for p in pairs}
    for setting, arm in pairs:  # arm-major: a campaign cut short leaves whole choices
        for seed in reg.TUNING_SEEDS:
            for lr in rates[setting, arm]:
                spec = RunSpec(tier, setting, arm, seed,
                               tuning_config(tier, setting, arm, seed, lr), "tuning")
                runs.setdefault(spec.hash, spec)
    return list(runs.values())


def tuned_rates(tier: str, store: Path = STORE, pairs=None, widened: bool = False) -> dict:
    """(setting, arm) -> ``RateChoice`` from the stored tuning records, by the registry's rule:
    over ``LR_GRID`` (the exploratory seeds' rates) or, ``widened``, over each arm's grid
    widened along ``LR_LADDER`` (``LR_WIDENING_RULE``: rule v3's rates)."""
    by_hash = records_by_hash(store / "tuning" / tier)
    pairs = pairs if pairs is not None else tier_pairs(
        [c for c in reg.CLAIMS.values() if tier in tiers_of(c)])

    def runs_at(setting, arm, lr):
        return [by_hash[h] for seed in reg.TUNING_SEEDS
                if (h := hash_or_none(tier, setting, arm, seed, lr, tuning=True)) in by_hash]

    ladder = reg.LR_LADDER.get(tier, ()) if widened else ()
    return {(setting, arm): _choice(lambda lr, s=setting, a=arm: runs_at(s, a, lr),
                                    reg.LR_GRID[tier], ladder)
            for setting, arm in pairs}


def _choice(runs_at, grid: tuple, ladder: tuple) -> RateChoice:
    """One arm's choice over ``grid``, widened one rung of ``ladder`` at a time while the choice
    is the grid's largest (smallest) rate."""
    grid = tuple(sorted(grid))
    while True:
        runs = {lr: runs_at(lr) for lr in grid}
        seeds = {lr: len(rs) for lr, rs in runs.items()}
        means = {lr: float(np.mean([primary_points(r) for r in rs])) for lr, rs in runs.items()
                 if rs}
        if not all(n == len(reg.TUNING_SEEDS) for n in seeds.values()):
            return RateChoice(None, means, seeds, grid=grid)
        lr = choose_rate(means)
        edge, wider = _widening(lr, grid, ladder)
        if wider is None:
            curve = cs.mean_curve([curve_points(r) for r in runs[lr]])
            best = max(curve, key=lambda point: point[1])[0]
            rejected = {x: n for x, rs in runs.items()
                        if (n := sum(r.get("rejected-replies", 0) for r in rs))}
            return RateChoice(lr, means, seeds, best, grid, (), edge, rejected)
        if len(runs_at(wider)) < len(reg.TUNING_SEEDS):  # the next rung is not all in
            return RateChoice(None, means, seeds, grid=grid, next_rates=(wider,))
        grid = tuple(sorted((*grid, wider)))


def validation_gaps(tier: str, store: Path = STORE) -> dict:
    """Setting -> (AllLarge - AllSmall on the validation split or None before both are tuned,
    AllLarge's rate, AllSmall's rate): each arm's mean over the tuning seeds at its chosen
    (widened) rate, the numbers a setting was calibrated on before any claim run."""
    settings = [st for st in reg.SETTINGS.values() if tier in st.tiers]
    rates = tuned_rates(tier, store, widened=True, pairs=[
        (st.id, arm) for st in settings for arm in (st.reference, st.small)])
    gaps = {}
    for st in settings:
        large, small = rates[st.id, st.reference], rates[st.id, st.small]
        both = large.lr is not None and small.lr is not None
        gaps[st.id] = (large.means[large.lr] - small.means[small.lr] if both else None,
                       large.lr, small.lr)
    return gaps


def _widening(lr: float, grid: tuple, ladder: tuple):
    """(why a choice at the grid's edge stays there, or None; the rung to run next, or None)."""
    if not ladder or grid[0] < lr < grid[-1]:
        return None, None
    beyond = [x for x in ladder if (x > lr if lr == grid[-1] else x < lr)]
    if not beyond:
        return f"the ladder ends at {lr:g}", None
    return None, min(beyond) if lr == grid[-1] else max(beyond)


def load_records(tier: str, store: Path = STORE, lr_mode: str = "tuned",
                 extra: dict | None = None, seeds=range(MAX_SEEDS), widened: bool = False
                 ) -> dict[tuple[str, str, int], dict]:
    """(setting, arm, seed) -> record, for every setting whose run config matches a stored run
    (a setting shares the runs of another with the same keys), at each arm's rate; ``extra``:
    the runs made with these keys over the tier's (a robustness check's); ``seeds``: which
    (default the exploratory 0..MAX_SEEDS-1 at ``LR_GRID``'s rates; rule v3 reads
    ``CONFIRMATORY_SEEDS`` at the widened grid's, ``widened``)."""
    by_hash = records_by_hash(store / "runs" / tier)
    out = {}
    if not by_hash:
        return out
    pairs = tier_pairs([c for c in reg.CLAIMS.values() if tier in tiers_of(c)])
    rates = arm_rates(tier, pairs, lr_mode, store, widened)
    for setting_id, arm in sorted(pairs):
        if (setting_id, arm) not in rates:
            continue  # not tuned yet
        for seed in seeds:
            spec_hash = hash_or_none(tier, setting_id, arm, seed, rates[setting_id, arm],
                                     extra=extra)
            if spec_hash in by_hash:
                out[setting_id, arm, seed] = by_hash[spec_hash]
    return out


