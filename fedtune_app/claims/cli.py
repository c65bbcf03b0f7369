"""Verdicts on the papers' claims: paired seeds, a statistical plan fixed in the registry.

    fedtune claims list [--tier mini]                         the registry (registry.py)
    fedtune claims tune [ID|GLOB ...] --tier mini             each arm's rate, on validation
    fedtune claims run [ID|GLOB ...] --tier mini [--lr paper] run what is missing, resumable
    fedtune claims report                                     docs/claims.md + curves, seconds

``run`` runs every (setting, arm, seed) the named claims need (all claims of the tier, in the
campaign's priority order, when none is named) through the real ServerApp and ClientApp in this
process (``run_inprocess``), seed-major within a priority block, so an interrupted campaign has
whole paired seeds. Each finished run leaves one small JSON record (its curve, which test
examples its last evaluations got right, the code fingerprint) in ``docs/claims/runs/<tier>/``,
named by the hash of its resolved run config: a run whose config hash is already there is
reused, on this machine or another (commit the files), and a changed key runs again.

On a tier with a learning-rate grid (``LR_GRID``: ``mini``) ``tune`` first runs every arm of
every setting at each rate of the grid on the tuning seeds, evaluated on the validation split,
into ``docs/claims/tuning/<tier>/``; the rule fixed in the registry (``LR_RULE``) picks each
arm's rate from those records, and ``run`` uses it (``--lr paper``: the papers' 0.01 instead,
whose verdicts the report shows beside). ``report`` only reads the records (``stats``).

Notebook use: ``list_claims()``, ``plan_runs(ids, tier, seeds)``, ``run_claims(ids, tier,
seeds)``, ``tuned_rates(tier)``, ``evaluate(tier)`` (one dict per claim) and ``write_report()``.
"""

from __future__ import annotations

import argparse
import sys

from fedtune_app.claims import registry as reg
from fedtune_app.claims.claim_text import ci_text
from fedtune_app.claims.execution import print_dry_run, run_claims, tune_claims
from fedtune_app.claims.planning import (
    parse_data_dirs,
    plan_runs,
    plan_tuning,
    validation_gaps,
)
from fedtune_app.claims.registry import (
    claim_seeds,
    claim_settings,
    tiers_of,
)
from fedtune_app.claims.report import write_report
from fedtune_app.claims.store import LR_MODES, TIERS


def list_claims(tier: str | None = None) -> list[dict]:
    return [{"id": c.id, "paper": c.paper, "table": c.table, "sentence": c.sentence,
             "direction": c.direction, "margin": c.margin,
             "seeds": {t: claim_seeds(c, t) for t in tiers_of(c)}, "priority": c.priority,
             "tiers": tiers_of(c), "paper-numbers": c.paper_numbers, "same-as": c.same_as}
            for c in reg.CLAIMS.values() if tier is None or tier in tiers_of(c)]


def list_settings(tier: str) -> list[dict]:
    """Each setting of ``tier`` with its gate on the stored runs: AllLarge - AllSmall (the rank
    settings: FedIT at the highest rank - the lowest), paired over the seeds both have, against
    the tier's calibration target where it has one."""
    from fedtune_app.claims.planning import load_records
    from fedtune_app.claims.verdicts import GAP_TARGET, setting_gap
    from fedtune_app.claims.verdicts_v3 import setting_gate

    records = load_records(tier)
    confirmatory = reg.CONFIRMATORY_SEEDS.get(tier)
    if confirmatory:
        confirmatory_records = load_records(tier, seeds=confirmatory, widened=True)
    validation = validation_gaps(tier) if tier in reg.LR_GRID else {}
    out = []
    for st in reg.SETTINGS.values():
        if tier not in st.tiers:
            continue
        if st.id in validation:  # the calibration the claims' rates came from
            value, large, small = validation[st.id]
            out.append({"id": st.id, "which": "validation", "gap": None, "seeds": [],
                        "value": value, "status": "not tuned yet" if value is None else
                        f"tuning seeds {', '.join(map(str, reg.TUNING_SEEDS))}, each arm at "
                        f"its chosen rate ({large:g}, {small:g})"})
        gap, seeds = setting_gap(st.id, records)
        later = all(c.id in reg.AFTER_EXPLORATORY for c in reg.CLAIMS.values()
                    if st.id in claim_settings(c))
        status = ("none: its claims run on the confirmatory seeds only" if confirmatory and later
                  else "not run yet") if gap is None else (
            "discriminative" if gap.mean >= GAP_TARGET else
            f"NOT discriminative by the {GAP_TARGET:g}-point target")
        out.append({"id": st.id, "gap": gap, "seeds": seeds, "status": status,
                    "which": "exploratory" if confirmatory else ""})
        if confirmatory:  # rule v3's gate: the lower 95% end above the planned detectable
            gate = setting_gate(st.id, tier, confirmatory_records, confirmatory)
            out.append({"id": st.id, "gap": gate.gap, "seeds": gate.seeds, "which":
                        "confirmatory", "status": "not run yet" if gate.gap is None else (
                            f"{len(gate.seeds)} of {len(confirmatory)} seeds in"
                            if gate.passes is None else
                            f"{'passes' if gate.passes else 'FAILS'} rule v3's gate (lower end "
                            f"above {reg.PLANNED_DETECTABLE[tier]:g})")})
    return out


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fedtune claims", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the claims, their papers' numbers and tiers")
    ls.add_argument("--tier", choices=TIERS)
    run = sub.add_parser("run", help="run what the claims still need (resumable)")
    tune = sub.add_parser("tune", help="run the learning-rate tuning runs (validation split) "
                          "and record each arm's rate (tiers with a grid: "
                          f"{', '.join(reg.LR_GRID)})")
    for p in (run, tune):
        p.add_argument("ids", nargs="*", help="claim ids or globs (default: every claim of the "
                       "tier, in the campaign's priority order)")
        p.add_argument("--tier", choices=TIERS, default="mini",
                       help="the tier (default mini: the papers' design in miniature)")
        p.add_argument("--arms", default="", metavar="LABEL,...",
                       help="only these arms, e.g. 'all-large,all-small' (the gate's) first, or "
                       "a disjoint share per process")
        p.add_argument("--dry-run", action="store_true",
                       help="list the runs and estimate what the ones to do cost; run nothing")
        p.add_argument("--no-report", action="store_true", help="do not regenerate the report")
        p.add_argument("--rerun-older", action="store_true",
                       help="run again the runs whose record was made by older code (its "
                       "fingerprint differs from its method's now; the report names them): the "
                       "new record replaces the old")
        p.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                       help="runs at once, each in its own process on one torch thread (e.g. "
                       "the machine's cores; default 1: one process, torch's own threads)")
    run.add_argument("--seeds", type=int, default=None,
                     help="seeds 0..N-1 for every claim (exploratory on a tier with "
                     "confirmatory seeds; default: each claim's fixed count on the tier: on "
                     "mini the ten confirmatory seeds of rule v3, 3 or 5 elsewhere)")
    run.add_argument("--set", default="", metavar="'KEY=VALUE ...'",
                     help="run-config keys for every run, e.g. 'device=\"cuda\"'")
    run.add_argument("--data-dir", action="append", default=[], metavar="DATASET=DIR",
                     help="the paper tier's data: the folder of one data set, set as 'data-dir' "
                     "on its runs only, e.g. nico++=/data/nico (repeat for domainnet)")
    run.add_argument("--check", choices=list(reg.CHECKS), default=None,
                     help="a robustness check of the registry: its claims (or those named) "
                     "with its keys, on its seeds (rounds-100: the papers' 100 rounds)")
    run.add_argument("--lr", choices=LR_MODES, default="tuned",
                     help="on a tier with a rate grid: each arm's tuned rate (default) or the "
                     f"papers' {reg.PAPER_LR:g} for every arm")
    rep = sub.add_parser("report", help="write docs/claims.md from the stored runs")
    rep.add_argument("--tier", choices=TIERS, action="append",
                     help="tiers to report (default: all)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for c in list_claims(args.tier):
            seeds = ",".join(f"{t}:{n}" for t, n in c["seeds"].items())
            print(f"{c['id']:38s} {c['paper']:10s} {c['table']:10s} seeds {seeds:26s} "
                  f"{c['sentence']}")
        if args.tier:
            print(f"\nsettings of tier {args.tier}: AllLarge - AllSmall on the test set (points, "
                  "paired 95% interval over the seeds both arms have; confirmatory: with the "
                  "test set's error, rule v3); validation: on the validation split over the "
                  "tuning seeds, where a tier tunes its rates")
            for st in list_settings(args.tier):
                gap = "-" if st["gap"] is None else \
                    f"{ci_text(st['gap'])} over {len(st['seeds'])} seeds"
                if st.get("value") is not None:
                    gap = f"{st['value']:.2f} (validation split)"
                print(f"{st['id']:38s} {st['which']:12s} {gap:32s} {st['status']}")
        return 0
    if args.command == "report":
        print(write_report(tuple(args.tier) if args.tier else TIERS))
        return 0
    from fedtune_app.config import setup_logging

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    if args.command == "tune":
        if args.dry_run:
            print_dry_run(plan_tuning(args.ids, args.tier, arms), args.rerun_older)
            print("rule v3 widens an arm whose choice sits at its grid's edge one rung at a "
                  "time: a rung's runs are planned once the rung before it is in, so more may "
                  "follow these")
            return 0
        setup_logging()
        choices = tune_claims(args.ids, args.tier, log=log, arms=arms, jobs=args.jobs,
                              rerun_older=args.rerun_older)
        for (st, arm), ch in choices.items():
            print(f"{st:32s} {arm:18s} lr {'-' if ch.lr is None else f'{ch.lr:g}'}")
    else:
        from fedtune_app.federated.flower_private import parse_config_args

        extra = parse_config_args([args.set]) if args.set else {}
        if args.check:  # a robustness check: its claims (or those named), keys and seeds
            check = reg.CHECKS[args.check]
            unknown = sorted(set(args.ids) - set(check.claims))
            if unknown:
                raise SystemExit(f"claims: --check {check.id} names {', '.join(check.claims)}; "
                                 f"not {', '.join(unknown)}")
            args.ids, args.seeds = args.ids or list(check.claims), args.seeds or check.seeds
            extra |= check.keys
        data_dirs = parse_data_dirs(args.data_dir)
        # rule v3: a tier with confirmatory seeds runs them unless seeds are named (a check
        # names its own: the exploratory ones it was planned on)
        confirmatory = args.tier in reg.CONFIRMATORY_SEEDS and args.seeds is None
        if args.dry_run:
            if confirmatory:
                print_confirmatory(args.ids, args.tier)
            print_dry_run(plan_runs(args.ids, args.tier, args.seeds, extra=extra, arms=arms,
                                    lr_mode=args.lr, data_dirs=data_dirs,
                                    confirmatory=confirmatory), args.rerun_older)
            return 0
        setup_logging()
        run_claims(args.ids, args.tier, args.seeds, log=log, extra=extra, arms=arms,
                   lr_mode=args.lr, data_dirs=data_dirs, jobs=args.jobs,
                   rerun_older=args.rerun_older, confirmatory=confirmatory)
    if not args.no_report:
        print(write_report())
    return 0


def print_confirmatory(ids: list[str], tier: str) -> None:
    """The confirmatory campaign's head: its rule, seeds, order and the claims it leaves out."""
    from fedtune_app.claims.planning import confirmatory_left_out, match_claims

    seeds = reg.CONFIRMATORY_SEEDS[tier]
    print(f"confirmatory campaign of tier {tier} (rule v3 of {reg.RULE_V3_DATE}): seeds "
          f"{seeds[0]}-{seeds[-1]}, the README's findings first "
          f"({', '.join(reg.CONFIRMATORY_ORDER)}), then the others by priority")
    for line in confirmatory_left_out(match_claims(ids, tier), tier):
        print(f"left out: {line}")


if __name__ == "__main__":
    sys.exit(main())
