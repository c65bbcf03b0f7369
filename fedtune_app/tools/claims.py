"""Verdicts on the papers' claims: paired seeds, a statistical plan fixed in the registry.

    fedtune claims list [--tier mini]                         the registry (claims_registry.py)
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
whose verdicts the report shows beside). ``report`` only reads the records (``claims_stats``).

Notebook use: ``list_claims()``, ``plan_runs(ids, tier, seeds)``, ``run_claims(ids, tier,
seeds)``, ``tuned_rates(tier)``, ``evaluate(tier)`` (one dict per claim) and ``write_report()``.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedtune_app.config import KEYS, ConfigError, load_preset, parse_int_list
from fedtune_app.tools import claims_registry as reg
from fedtune_app.tools import claims_stats as cs
from fedtune_app.tools.claims_registry import (
    ARMS,
    CLAIMS,
    CPU_BASE,
    CPU_GROUPS,
    METRIC_NOTE,
    SETTINGS,
    Claim,
    claim_arms,
    claim_seeds,
    claim_settings,
    tiers_of,
)
from fedtune_app.tools.fingerprint import code_fingerprint, code_fingerprints

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "docs" / "claims"  # runs/<tier>/*.json, tuning/<tier>/*.json (committed), PNGs
REPORT = ROOT / "docs" / "claims.md"
README = ROOT / "README.md"  # its verdict table sits between these two lines
README_BEGIN, README_END = "<!-- claims-table: begin -->", "<!-- claims-table: end -->"
RESULTS = ROOT / "results" / "claims"  # the runs' full results folders (not committed)
TIERS = ("mini", "cpu", "gpu", "paper")  # the report's order: the papers' design first
LR_MODES = ("tuned", "paper")
MAX_SEEDS = 10  # the report looks for seeds 0..MAX_SEEDS-1
DEPTH = {"mini": 12, "cpu": 6, "gpu": 12, "paper": 12}  # blocks of the tier's backbones
# points: the mean AllLarge - AllSmall each setting of a tier with a fixed seed count was
# calibrated to reach (the papers' gap is about 50); a setting under it is named, not hidden
GAP_TARGET = 15.0
BELOW_TARGET = (f"setting not discriminative by the tier's {GAP_TARGET:g}-point AllLarge - "
                "AllSmall target")
# keys that change where or how often a run writes, not what it computes
BOOKKEEPING = {"results-dir", "tracker", "checkpoint-every", "resume", "preset", "device",
               "data-workers", "eval-batch-size", "round-timeout", "min-nodes", "checkpoint-dir",
               "data-dir"}


@dataclass(frozen=True)
class RunSpec:
    tier: str
    setting: str
    arm: str
    seed: int
    keys: dict  # the run config given to the run
    folder: str = "runs"  # runs: a claim's; tuning: a learning-rate tuning run's

    @property
    def key(self) -> dict:
        return run_key(self.keys)

    @property
    def hash(self) -> str:
        return config_hash(self.keys)

    @property
    def name(self) -> str:
        lr = f"__lr{self.keys['lr']:g}" if self.folder == "tuning" else ""
        return f"{self.setting}__{self.arm}__seed{self.seed}{lr}__{self.hash}"


def run_config(tier: str, setting_id: str, arm_label: str, seed: int,
               lr: float | None = None) -> dict:
    """The run config of one arm of one setting on one seed (a preset is expanded, so every
    given key counts); ``lr``: the arm's rate on a tier that tunes it (None: the tier's own).
    AllLarge and AllSmall ignore the capacity list but for its length and its minimum, and the
    rounds' draws of dynamic capacities: they get it canonical (AllSmall's depth in it), so every
    setting with the same data shares their runs (FedRA Table 4 repeats Table 1's rows)."""
    import fedtune_app.methods  # noqa: F401 - registers the method-owned keys presets may set

    setting, arm = SETTINGS[setting_id], ARMS[arm_label]
    if tier not in setting.tiers:
        raise ValueError(f"setting {setting_id!r} has no {tier!r} tier (has: "
                         f"{', '.join(setting.tiers)})")
    keys = dict(setting.tiers[tier])
    preset = keys.pop("preset", "")
    keys = (load_preset(preset) if preset else {}) | keys | arm.keys | arm.tier_keys.get(tier, {})
    keys |= {"method": arm.method, "seed": seed}
    if lr is not None:
        keys["lr"] = lr
    plain_list = keys.get("capacity-profile", "list") == "list" and not keys.get("model-groups")
    if plain_list and arm.method in ("all-large", "all-small"):
        caps = parse_int_list("capacities", str(keys.get("capacities", KEYS["capacities"].default)))
        smallest = keys.pop("all-small-layers", 0) or min(caps)
        keys.pop("dynamic-capacities", None)
        depth = DEPTH[tier] if arm.method == "all-large" else smallest
        keys["capacities"] = f"{depth}*{len(caps)}"
    return keys


def tuning_config(tier: str, setting_id: str, arm_label: str, seed: int, lr: float) -> dict:
    """A tuning run: the arm at one rate of the grid, evaluated on the validation split."""
    return run_config(tier, setting_id, arm_label, seed, lr) | reg.TUNING_KEYS


def run_key(keys: dict) -> dict:
    """What a run computes: its resolved config without bookkeeping keys and without keys at
    their library default (so a key added later with a neutral default keeps the cache)."""
    from fedtune_app.methods import resolve_config

    cfg = resolve_config(keys)
    # a method that puts every client in one model group (AllSmall, AllLarge) computes nothing
    # from the ratio of the groups: settings that differ only in it share its runs
    unused = {"model-group-ratio"} if cfg.fixed_group is not None else set()
    return {k: v for k, v in sorted(cfg.flat.items())
            if k not in BOOKKEEPING | unused and not (k in KEYS and v == KEYS[k].default)}


def config_hash(keys: dict) -> str:
    text = json.dumps(run_key(keys), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stored_paths(spec: RunSpec, store: Path = STORE) -> list[Path]:
    """The files holding ``spec``'s record, in name order: a run that settings share (AllLarge)
    is stored once, under the name of the setting that ran it first (two campaigns that started
    it at once may each have stored it; the first in name order is read)."""
    return sorted((store / spec.folder / spec.tier).glob(f"*__{spec.hash}.json"))


def find_cached(spec: RunSpec, store: Path = STORE) -> dict | None:
    hits = stored_paths(spec, store)
    return json.loads(hits[0].read_text()) if hits else None


def made_by_older_code(record: dict, fingerprint_now: str) -> bool:
    """Whether a record's code fingerprint differs from its method's now (or it has none)."""
    return record.get("fingerprint") != fingerprint_now


def run_state(spec: RunSpec, record: dict | None, fingerprints: dict[str, str]) -> str:
    """'todo' (no stored record), 'older' (stored by older code: ``--rerun-older`` runs it
    again) or 'done'; ``fingerprints``: method -> its fingerprint now."""
    if record is None:
        return "todo"
    return "older" if made_by_older_code(record, fingerprints[spec.keys["method"]]) else "done"


def run_cost(record: dict) -> float:
    """One core's seconds of a run: its CPU seconds, else (older records) its wall seconds."""
    return record.get("cpu-seconds", record["seconds"])


def cost_to_do(todo: list[RunSpec], store: Path = STORE) -> tuple[float, int]:
    """Seconds the runs ``todo`` cost at the stored seconds of the same arm (its mean in the same
    setting, else in any setting of the tier), and how many runs of arms with no stored run."""
    seconds: dict = {}
    for tier in {s.tier for s in todo}:
        for folder in ("runs", "tuning"):
            for path in (store / folder / tier).glob("*.json"):
                r = json.loads(path.read_text())
                seconds.setdefault((tier, r["setting"], r["arm"]), []).append(run_cost(r))
                seconds.setdefault((tier, r["arm"]), []).append(run_cost(r))
    known, unknown = 0.0, 0
    for s in todo:
        past = seconds.get((s.tier, s.setting, s.arm)) or seconds.get((s.tier, s.arm))
        if past:
            known += float(np.mean(past))
        else:
            unknown += 1
    return known, unknown


def estimate_cost(specs: list[RunSpec], store: Path = STORE,
                  todo: list[RunSpec] | None = None) -> str:
    """What the runs still to do (``todo``; default: those with no stored record) cost, from the
    stored records of the same arm."""
    todo = [s for s in specs if find_cached(s, store) is None] if todo is None else todo
    known, unknown = cost_to_do(todo, store)
    text = (f"{len(todo)} of {len(specs)} runs to do: about {known / 3600:.1f} core-hours at "
            "the stored seconds of the same arm")
    return text + (f"; {unknown} runs of arms with no stored run not counted" if unknown else "")


def match_claims(patterns: list[str], tier: str) -> list[Claim]:
    """Claims named by id or glob (all claims of the tier when none), in priority order.

    A glob keeps the claims it matches that have the tier ('heterotune-*' on the CPU tier skips
    the GPU-only LLaMA rows); an id, or a glob none of whose claims has the tier, is an error.
    """
    available = [c for c in CLAIMS.values() if tier in tiers_of(c)]
    if not patterns:
        chosen = available
    else:
        chosen = []
        for p in patterns:
            hits = [c for c in CLAIMS.values() if fnmatch.fnmatch(c.id, p)]
            if not hits:
                raise SystemExit(f"claims: no claim matches {p!r}; `fedtune claims list` "
                                 "shows them")
            in_tier = [c for c in hits if c in available]
            if not in_tier:
                has = "; ".join(f"{c.id} has: {', '.join(tiers_of(c)) or 'none'}" for c in hits)
                raise SystemExit(f"claims: {p!r} matches no claim with a {tier!r} tier ({has})")
            chosen += in_tier
    chosen = list(dict.fromkeys(chosen))
    return sorted(chosen, key=lambda c: (c.priority, list(CLAIMS).index(c.id)))


def tier_pairs(claims: list[Claim]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(p for c in claims for p in claim_arms(c)))


def arm_rates(tier: str, pairs, lr_mode: str = "tuned", store: Path = STORE) -> dict:
    """(setting, arm) -> the rate its claim runs use: None on a tier without a grid (its own
    keys' rate), the papers' 0.01 with ``lr_mode='paper'``, else the tuned choice (missing
    where the tuning runs are not all in)."""
    if lr_mode not in LR_MODES:
        raise SystemExit(f"claims: --lr {lr_mode!r}: expected one of {', '.join(LR_MODES)}")
    if tier not in reg.LR_GRID:
        return {p: None for p in pairs}
    if lr_mode == "paper":
        return {p: reg.PAPER_LR for p in pairs}
    choices = tuned_rates(tier, store, pairs)
    return {p: choices[p].lr for p in pairs if choices[p].lr is not None}


def plan_runs(patterns: list[str] = (), tier: str = "cpu", seeds: int | None = None,
              store: Path = STORE, extra: dict | None = None,
              arms: list[str] | None = None, lr_mode: str = "tuned",
              data_dirs: dict | None = None) -> list[RunSpec]:
    """Every distinct run the claims need, in campaign order: priority blocks, seed-major within
    a block (seed 0 of every arm, then seed 1, ...), the gate's arms first in each seed.
    ``seeds``: 0..seeds-1 for every claim (default: each claim's fixed count on the tier).
    ``arms``: only these arm labels (e.g. the gate's arms of every seed first, or one share of
    the campaign per process or machine). On a tier that tunes rates, each arm runs at its
    chosen rate (``lr_mode='paper'``: at 0.01); an arm not tuned yet is an error.
    ``data_dirs``: dataset -> its ``data-dir``, set on the runs of that dataset only (the paper
    tier reads NICO++ and DomainNet from two folders)."""
    _check_arms(arms)
    data_dirs = data_dirs or {}
    runs: dict[str, RunSpec] = {}
    claims = match_claims(list(patterns), tier)
    rates = arm_rates(tier, tier_pairs(claims), lr_mode, store)
    untuned = [p for p in tier_pairs(claims) if p not in rates and (not arms or p[1] in arms)]
    if untuned:
        raise SystemExit(f"claims: no learning rate chosen yet for {len(untuned)} arm(s) of tier "
                         f"{tier!r} (e.g. {untuned[0][1]} in {untuned[0][0]}): run `fedtune "
                         f"claims tune --tier {tier}` first, or `--lr paper` for the papers' "
                         "0.01")
    for priority in sorted({c.priority for c in claims}):
        block = [c for c in claims if c.priority == priority]
        pairs = tier_pairs(block)
        need = {p: max((seeds or claim_seeds(c, tier)) for c in block if p in claim_arms(c))
                for p in pairs}
        for seed in range(max(need.values())):
            for setting, arm in pairs:
                if seed < need[setting, arm] and (not arms or arm in arms):
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
    the tuning seeds in, points), ``lr`` by the registry's rule once every rate has every tuning
    seed (else None), ``best_round``: the round of the chosen rate's highest mean validation
    curve (the report reads the claim runs' test accuracy there)."""

    lr: float | None
    means: dict = field(default_factory=dict)
    seeds: dict = field(default_factory=dict)  # rate -> tuning seeds in
    best_round: int | None = None


def choose_rate(means: dict) -> float:
    """``LR_RULE``: the highest mean; means equal to 0.01 points go to the smaller rate."""
    rounded = {lr: round(m, 2) for lr, m in means.items()}
    top = max(rounded.values())
    return min(lr for lr, m in rounded.items() if m == top)


def plan_tuning(patterns: list[str] = (), tier: str = "mini",
                arms: list[str] | None = None) -> list[RunSpec]:
    """Every tuning run the claims need: each (setting, arm) at each rate of the grid on each
    tuning seed, seed-major."""
    if tier not in reg.LR_GRID:
        raise SystemExit(f"claims: tier {tier!r} has no learning-rate grid (tiers that tune: "
                         f"{', '.join(reg.LR_GRID)}); it runs {reg.PAPER_LR:g} untuned")
    _check_arms(arms)
    runs: dict[str, RunSpec] = {}
    pairs = tier_pairs(match_claims(list(patterns), tier))
    for seed in reg.TUNING_SEEDS:
        for setting, arm in pairs:
            if arms and arm not in arms:
                continue
            for lr in reg.LR_GRID[tier]:
                spec = RunSpec(tier, setting, arm, seed,
                               tuning_config(tier, setting, arm, seed, lr), "tuning")
                runs.setdefault(spec.hash, spec)
    return list(runs.values())


def tuned_rates(tier: str, store: Path = STORE, pairs=None) -> dict:
    """(setting, arm) -> ``RateChoice`` from the stored tuning records, by the registry's rule."""
    by_hash = _records_by_hash(store / "tuning" / tier)
    pairs = pairs if pairs is not None else tier_pairs(
        [c for c in CLAIMS.values() if tier in tiers_of(c)])
    out = {}
    for setting, arm in pairs:
        runs = {lr: [by_hash[h] for seed in reg.TUNING_SEEDS
                     if (h := _hash_or_none(tier, setting, arm, seed, lr, tuning=True)) in by_hash]
                for lr in reg.LR_GRID[tier]}
        means = {lr: float(np.mean([primary_points(r) for r in rs])) for lr, rs in runs.items()
                 if rs}
        complete = all(len(rs) == len(reg.TUNING_SEEDS) for rs in runs.values())
        lr = choose_rate(means) if complete else None
        best = None
        if lr is not None:
            curve = cs.mean_curve([curve_points(r) for r in runs[lr]])
            best = max(curve, key=lambda point: point[1])[0]
        out[setting, arm] = RateChoice(lr, means, {k: len(v) for k, v in runs.items()}, best)
    return out


def tune_claims(patterns: list[str] = (), tier: str = "mini", store: Path = STORE,
                results: Path = RESULTS, log=print, arms: list[str] | None = None,
                jobs: int = 1, rerun_older: bool = False) -> dict:
    """Run the tuning runs still missing (``jobs`` at a time; ``rerun_older``: and those made
    by older code); write ``tuning/<tier>-rates.json`` (each arm's rate and validation means)
    and return the choices."""
    specs = plan_tuning(patterns, tier, arms)
    _run_specs(specs, store, results, log, "tuning", jobs, rerun_older)
    choices = tuned_rates(tier, store, tier_pairs(match_claims(list(patterns), tier)))
    from fedtune_app.apps.results import write_json

    write_json(store / "tuning" / f"{tier}-rates.json", {
        "rule": reg.LR_RULE, "grid": list(reg.LR_GRID[tier]), "seeds": list(reg.TUNING_SEEDS),
        "rates": {f"{s} {a}": {"lr": c.lr, "best-round": c.best_round,
                               "validation-means": {f"{k:g}": v for k, v in c.means.items()}}
                  for (s, a), c in choices.items()}})
    return choices


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record_method(record: dict) -> str:
    """The method a record ran: its arm's (the run key leaves out a key at its default)."""
    return ARMS[record["arm"]].method


def summarize_run(spec: RunSpec, folder: Path, seconds: float, commit: str,
                  fingerprint: str | None = None, cpu_seconds: float | None = None) -> dict:
    """The small record of a finished run: its curve, final metrics, rejected replies, which test
    examples its last evaluations got right, and the fingerprint of the code that ran it."""
    from fedtune_app.apps.evaluation import unpack_correct

    metrics = json.loads((folder / "metrics.json").read_text())
    curve, correct = [], []
    for m in metrics:
        if m["accuracy"] is None:
            continue
        point = {"round": m["round"], "loss": m.get("loss")}
        point |= {k: v for k, v in m.items()
                  if k.startswith("accuracy") and isinstance(v, (int, float))}
        curve.append(point)
        correct.append(m.get("test-correct"))
    record = {"tier": spec.tier, "setting": spec.setting, "arm": spec.arm, "seed": spec.seed,
              "hash": spec.hash, "run-key": spec.key, "lr": spec.keys.get("lr"), "curve": curve,
              "final": curve[-1]["accuracy"],
              "rejected-replies": sum(len(m.get("rejected") or ()) for m in metrics),
              "seconds": round(seconds, 1), "rounds": len(metrics),
              # this process's CPU time: one core's cost, whatever else shared the machine
              **({} if cpu_seconds is None else {"cpu-seconds": round(cpu_seconds, 1)}),
              "commit": commit,
              "fingerprint": fingerprint or code_fingerprint(spec.keys["method"]),
              "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    window = correct[-cs.LAST_EVALUATIONS:]
    if window and all(window):  # the primary metric's evaluations, example by example
        record["test-correct"] = [_by_group(c) for c in window]
        first = next(iter(record["test-correct"][0].values()))
        record["test-examples"] = sum(len(unpack_correct(v)) for v in first.values())
    return record


def _by_group(correct: dict) -> dict:
    """{stratum: packed} (one model) or {group: {stratum: packed}} -> the latter."""
    return correct if isinstance(next(iter(correct.values())), dict) else {"0": correct}


def execute(spec: RunSpec, results: Path = RESULTS, store: Path = STORE,
            commit: str | None = None, fingerprint: str | None = None,
            rerun_older: bool = False) -> dict:
    """Run one (setting, arm, seed) in this process and store its record; ``commit`` and
    ``fingerprint``: the code this process loaded (HEAD may move while a campaign runs). A run
    another campaign stored since this one planned is not run again (with ``rerun_older``: one
    stored by this code): its record comes back, marked ``reused``."""
    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.apps.results import write_json

    method = spec.keys["method"]
    fingerprint = fingerprint or code_fingerprint(method)
    stored = find_cached(spec, store)
    if stored is not None and not (rerun_older and run_state(spec, stored, {method: fingerprint})
                                   == "older"):
        return stored | {"reused": True}
    commit = commit or git_commit()
    started, cpu_started = time.time(), time.process_time()
    # a folder per run: runs of one method and seed (tuning's rates) start in the same second
    folder = Path(run_inprocess(spec.keys | {"results-dir": str(results / spec.tier / spec.name)}))
    record = summarize_run(spec, folder, time.time() - started, commit, fingerprint,
                           time.process_time() - cpu_started)
    record["results-folder"] = str(folder.relative_to(ROOT) if folder.is_relative_to(ROOT)
                                   else folder)
    # a record run again (older code) replaces the one stored, under that one's name (a run
    # settings share keeps the name it has): every reader finds the new one
    old = stored_paths(spec, store)
    path = old[0] if old else store / spec.folder / spec.tier / f"{spec.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
    for duplicate in old[1:]:
        duplicate.unlink()
    return record


# what a run imports when it first needs it (seconds each): a fork server imports them once
LAZY_IMPORTS = ("timm", "peft", "transformers", "datasets", "flwr_datasets", "sklearn")


def _start_worker() -> None:
    """A worker of ``--jobs``: one torch thread, and it ends with the process that started it.
    Killed by a signal, that process runs no clean-up, and the runs it had handed out would go
    on for minutes, unseen, taking the cores and storing records (the watch is on the pipe its
    parent holds open, which closes however the parent ends)."""
    import multiprocessing
    import threading

    import torch

    torch.set_num_threads(1)
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True,
                     name="exit-with-parent").start()


def worker_pool(jobs: int, preload: tuple[str, ...] = ()):
    """``jobs`` worker processes, each on one torch thread, ended with this process. Not forks
    of this process (a forked torch with its threads started can hang): a fork server that has
    imported ``preload`` once, before any torch thread exists."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    return ProcessPoolExecutor(jobs, context, initializer=_start_worker)


def missing_checkpoints_of_runs(specs: list[RunSpec]) -> list[str]:
    """The backbone checkpoints these runs need that this machine lacks (the stand-ins are made
    offline and kept out of git), each with the command that makes it."""
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools import pretrain

    one_per_arm = {(s.setting, s.arm): s for s in specs}.values()  # seeds share their files
    return sorted({m for s in one_per_arm
                   for m in pretrain.missing_checkpoints(resolve_config(s.keys))})


def check_checkpoints(specs: list[RunSpec]) -> None:
    """Refuse a campaign whose runs would stop on a missing checkpoint, before any starts."""
    if missing := missing_checkpoints_of_runs(specs):
        raise ConfigError(f"claims: {len(specs)} runs to do, and their backbone checkpoints are "
                          "missing: " + "; ".join(missing) + ". Nothing was run.")


def print_dry_run(specs: list[RunSpec], rerun_older: bool = False, store: Path = STORE) -> None:
    """What a campaign would do: each run done, done by older code ('older': run again with
    ``rerun_older``) or to do; the core-hours left, and the checkpoints it would stop on."""
    fingerprints = code_fingerprints()
    todo, older = [], 0
    for spec in specs:
        state = run_state(spec, find_cached(spec, store), fingerprints)
        todo += [spec] if state == "todo" or (state == "older" and rerun_older) else []
        older += state == "older"
        print(f"{state} {spec.name}")
    print(estimate_cost(specs, store, todo)
          + (f"; {older} done by older code, which `--rerun-older` runs again"
             if older and not rerun_older else ""))
    if missing := missing_checkpoints_of_runs(todo):
        print("missing backbone checkpoints (the campaign would stop on them): "
              + "; ".join(missing))


def _run_specs(specs: list[RunSpec], store: Path, results: Path, log, what: str,
               jobs: int = 1, rerun_older: bool = False) -> list[dict]:
    """Run the specs not yet in ``store`` (``rerun_older``: and those stored by older code, whose
    new records replace the old); ``jobs`` > 1: that many at once, each in its own
    process on one torch thread (every run is seeded on its own, so its record does not depend
    on which process ran it). A failed run stops the campaign after the runs under way; every
    finished run is stored as it ends."""
    from fedtune_app.apps.inprocess import progress

    commit, fingerprints = git_commit(), code_fingerprints()
    done = {s.hash: find_cached(s, store) for s in specs}
    state = {s.hash: run_state(s, done[s.hash], fingerprints) for s in specs}
    todo = [s for s in specs if state[s.hash] == "todo" or rerun_older and state[s.hash] == "older"]
    check_checkpoints(todo)
    older = sum(state[s.hash] == "older" for s in todo)
    log(f"claims: {len(specs)} {what} runs, {len(specs) - len(todo)} already done, "
        f"{len(todo)} to run" + (f" ({older} of them made by older code)" if older else "")
        + (f", {jobs} at a time" if jobs > 1 and todo else ""))

    def finished(i: int, spec: RunSpec, record: dict) -> None:
        reused = record.pop("reused", False)
        done[spec.hash] = record
        lr = f" lr {spec.keys['lr']:g}" if "lr" in spec.keys else ""
        outcome = ("stored meanwhile by another campaign, not run again" if reused else
                   f"accuracy {100 * record['final']:.2f}% in {record['seconds']:.0f} s, "
                   f"{record['rejected-replies']} replies rejected")
        log(f"claims: {what} run {i}/{len(todo)} {spec.setting} {spec.arm} seed "
            f"{spec.seed}{lr}: {outcome}")

    if jobs > 1 and len(todo) > 1:
        from concurrent.futures import as_completed

        with worker_pool(jobs, ("fedtune_app.apps.inprocess", "fedtune_app.methods",
                                *LAZY_IMPORTS)) as pool:
            running = {pool.submit(execute, spec, results, store, commit,
                                   fingerprints[spec.keys["method"]], rerun_older): spec
                       for spec in todo}
            try:
                for i, future in enumerate(as_completed(running), 1):
                    finished(i, running[future], future.result())
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    else:
        with progress([s.keys for s in todo], what):
            for i, spec in enumerate(todo, 1):
                finished(i, spec, execute(spec, results, store, commit,
                                          fingerprints[spec.keys["method"]], rerun_older))
    return [done[s.hash] for s in specs]


def run_claims(patterns: list[str] = (), tier: str = "cpu", seeds: int | None = None,
               store: Path = STORE, results: Path = RESULTS, log=print,
               extra: dict | None = None, arms: list[str] | None = None,
               lr_mode: str = "tuned", data_dirs: dict | None = None,
               jobs: int = 1, rerun_older: bool = False) -> list[dict]:
    """Run whatever the claims still need (finished runs are found by hash and skipped;
    ``rerun_older``: not those made by older code), one progress bar with an ETA over every
    round of the runs left (``jobs`` > 1: a line per finished run); the records of all runs.
    ``extra``: keys for every run, e.g. {"device": "cuda"}; ``data_dirs``: as ``plan_runs``."""
    specs = plan_runs(patterns, tier, seeds, store, extra, arms, lr_mode, data_dirs)
    return _run_specs(specs, store, results, log, "claims", jobs, rerun_older)


# ---------------------------------------------------------------- records and evaluation

def _records_by_hash(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        record["file"] = path.name
        out.setdefault(record["hash"], record)  # the first in name order, as ``find_cached``
    return out


def load_records(tier: str, store: Path = STORE, lr_mode: str = "tuned"
                 ) -> dict[tuple[str, str, int], dict]:
    """(setting, arm, seed) -> record, for every setting whose run config matches a stored run
    (a setting shares the runs of another with the same keys), at each arm's rate."""
    by_hash = _records_by_hash(store / "runs" / tier)
    out = {}
    if not by_hash:
        return out
    pairs = tier_pairs([c for c in CLAIMS.values() if tier in tiers_of(c)])
    rates = arm_rates(tier, pairs, lr_mode, store)
    for setting_id, arm in sorted(pairs):
        if (setting_id, arm) not in rates:
            continue  # not tuned yet
        for seed in range(MAX_SEEDS):
            spec_hash = _hash_or_none(tier, setting_id, arm, seed, rates[setting_id, arm])
            if spec_hash in by_hash:
                out[setting_id, arm, seed] = by_hash[spec_hash]
    return out


_HASHES: dict = {}


def _hash_or_none(tier, setting_id, arm, seed, lr=None, tuning=False):
    """The config hash of a (setting, arm, seed) at a rate, None where the arm does not fit the
    setting or the config does not resolve (e.g. a preset this checkout lacks)."""
    setting = SETTINGS.get(setting_id)  # keyed on what the registry says now (tests change it)
    key = (tier, setting_id, arm, seed, lr, tuning, repr(setting and setting.tiers.get(tier)),
           repr(reg.TUNING_KEYS) if tuning else "")
    if key not in _HASHES:
        try:
            keys = (tuning_config(tier, setting_id, arm, seed, lr) if tuning
                    else run_config(tier, setting_id, arm, seed, lr))
            _HASHES[key] = config_hash(keys)
        except Exception:  # an arm that does not fit the setting (e.g. HeteroTune, one model)
            _HASHES[key] = None
    return _HASHES[key]


def curve_points(record: dict, metric: str = "accuracy") -> list[tuple[int, float]]:
    return [(p["round"], 100 * p[metric]) for p in record["curve"]]


def primary_points(record: dict, metric: str = "accuracy") -> float:
    """The primary metric of a run in points: the mean of its last three evaluations."""
    return cs.primary([v for _, v in curve_points(record, metric)])


def final_points(record: dict, metric: str = "accuracy") -> float:
    return curve_points(record, metric)[-1][1]


def best_points(record: dict, metric: str = "accuracy") -> float:
    """Its best evaluation on the test set: only the collapse flag reads it."""
    return max(v for _, v in curve_points(record, metric))


def setting_gap(setting_id: str, records: dict) -> tuple[cs.Interval | None, list[int]]:
    """AllLarge - AllSmall (primary metric, paired over the seeds both have)."""
    st = SETTINGS[setting_id]
    seeds = [s for s in range(MAX_SEEDS) if (setting_id, st.reference, s) in records
             and (setting_id, st.small, s) in records]
    if not seeds:
        return None, []
    gaps = [primary_points(records[setting_id, st.reference, s])
            - primary_points(records[setting_id, st.small, s]) for s in seeds]
    return cs.t_interval(gaps), seeds


def _label(claim: Claim, setting: str, arm: str) -> str:
    return f"{arm} ({setting})" if len(claim_settings(claim)) > 1 else arm


def _unpacked(record: dict) -> list[dict]:
    from fedtune_app.apps.evaluation import unpack_correct

    return [{g: {s: unpack_correct(v) for s, v in strata.items()} for g, strata in ev.items()}
            for ev in record["test-correct"]]


def test_set_error(claim: Claim, tier: str, records: dict, seeds: list[int]) -> tuple:
    """(standard error in points, how): a bootstrap over test examples where every run of the
    claim recorded them, else the binomial bound on the tier's test-set size, else NaN."""
    runs = [[(c, records[st, a, s]) for c, st, a in claim.terms] for s in seeds]
    if all("test-correct" in r for seed_terms in runs for _, r in seed_terms):
        return cs.bootstrap_se([[(c, _unpacked(r)) for c, r in seed_terms]
                                for seed_terms in runs]), "bootstrap over test examples"
    n = reg.TEST_EXAMPLES.get(tier)
    if n is None:
        return math.nan, ""
    means = [np.mean([primary_points(records[st, a, s]) for s in seeds]) / 100
             for _, st, a in claim.terms]
    return (cs.binomial_se(means, [c for c, _, _ in claim.terms], n),
            f"binomial bound on {n} test examples (these records keep no per-example results)")


READ_AT_ROUNDS = 5  # the last evaluations a claim's difference is also shown at, one by one


def differences_by_round(claim: Claim, records: dict, seeds: list[int],
                         last: int = READ_AT_ROUNDS) -> list[tuple[int, cs.Interval]]:
    """The claim's paired difference read at each of the last evaluated rounds that every run
    of it has, one evaluation each (not the primary metric's mean of three): whether the
    answer depends on the round it is read at."""
    curves = {(st, a, s): dict(curve_points(records[st, a, s]))
              for s in seeds for _, st, a in claim.terms}
    rounds = sorted(set.intersection(*(set(c) for c in curves.values())))[-last:]
    return [(r, cs.t_interval([sum(c * curves[st, a, s][r] for c, st, a in claim.terms)
                               for s in seeds], cs.interval_for(claim.direction)))
            for r in rounds]


def evaluate_claim(claim: Claim, tier: str, records: dict, rates: dict | None = None) -> dict:
    """A claim's numbers and its verdict before Holm's adjustment (``evaluate`` adjusts)."""
    need = claim_seeds(claim, tier)
    settings = claim_settings(claim)
    seeds = [s for s in range(need) if all((st, a, s) in records for _, st, a in claim.terms)]
    row = {"claim": claim, "tier": tier, "seeds": seeds, "need": need, "per_arm": {},
           "testable": False, "tested": False, "differences": [], "convergence": {}, "gaps": {},
           "collapse": {}, "below_target": []}
    if not seeds:
        row["verdict"] = cs.Verdict(cs.NOT_RUN)
        return row
    for _, st, a in claim.terms:
        rs = [records[st, a, s] for s in seeds]
        choice = (rates or {}).get((st, a))
        selected = None
        if choice is not None and choice.best_round is not None:
            at = [dict(curve_points(r)).get(choice.best_round) for r in rs]
            selected = (choice.best_round, float(np.mean(at))) if None not in at else None
        row["per_arm"][_label(claim, st, a)] = {
            "primary": cs.t_interval([primary_points(r) for r in rs]),
            "final": cs.t_interval([final_points(r) for r in rs]),
            "selected": selected, "lr": rs[0].get("lr")}
        small = [records.get((st, SETTINGS[st].small, s)) for s in seeds]
        if a != SETTINGS[st].small and None not in small:
            why = cs.collapse([final_points(r) for r in rs], [best_points(r) for r in rs],
                              [final_points(r) for r in small])
            if why:
                row["collapse"][_label(claim, st, a)] = why
        try:
            row["convergence"][_label(claim, st, a)] = cs.arm_convergence(
                [curve_points(r) for r in rs])
        except ValueError as e:  # too few evaluations for the two windows
            row["convergence"][_label(claim, st, a)] = (False, str(e))
    diffs = [sum(c * primary_points(records[st, a, s]) for c, st, a in claim.terms)
             for s in seeds]
    ci = cs.t_interval(diffs, cs.interval_for(claim.direction))
    detect = cs.detectable(ci.std, need, claim.direction)
    row |= {"differences": diffs, "test_error": test_set_error(claim, tier, records, seeds),
            "by_round": differences_by_round(claim, records, seeds)}
    for st in settings:
        gap, gap_seeds = setting_gap(st, records)
        row["gaps"][st] = (gap, cs.discriminates(gap, detect) if gap else None, gap_seeds)
    row["below_target"] = [st for st, (gap, _, _) in row["gaps"].items()
                           if tier in reg.TIER_SEEDS and gap and gap.mean < GAP_TARGET]
    p = cs.p_value(diffs, claim.direction, claim.margin)
    verdict, reason = None, ""
    unconverged = [a for a, (ok, _) in row["convergence"].items() if ok is False]
    blind = [st for st, (_, ok, _) in row["gaps"].items() if ok is False]
    if len(seeds) < need:
        verdict, reason = cs.RUNNING, f"{len(seeds)} of {need} seeds"
    elif unconverged:
        verdict, reason = cs.NOT_CONVERGED, ", ".join(unconverged)
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
    row["verdict"] = cs.Verdict(verdict or cs.INCONCLUSIVE, ci, p, math.nan, detect, reason,
                                tuple(f"{a}: {w}" for a, w in row["collapse"].items()))
    return row


def _identical(claim: Claim, records: dict, seeds: list[int]) -> bool | None:
    """For a claim marked ``same_as``: are its runs the other claim's, evaluation for
    evaluation, on every seed both have?"""
    other = CLAIMS[claim.same_as]
    mine = [(st, a) for _, st, a in claim.terms]
    theirs = [(st, a) for _, st, a in other.terms]
    pairs = [(m, t) for m, t in zip(mine, theirs) if m != t]
    if not seeds or any((*p, s) not in records for m, t in pairs for p in (m, t) for s in seeds):
        return None
    return all(records[(*m, s)]["curve"] == records[(*t, s)]["curve"]
               for m, t in pairs for s in seeds)


def evaluate(tier: str = "cpu", store: Path = STORE, records: dict | None = None,
             lr_mode: str = "tuned") -> list[dict]:
    """One row per claim of the tier with its verdict. Holm's family is every claim the tier
    plans (duplicates counted once), fixed before any run: a claim without all its seeds
    counts as p = 1, so an adjusted p never shrinks because other claims have not run yet.
    A claim whose gate fails keeps its adjusted p and what its test alone says
    (``row["test_alone"]``), but no verdict."""
    records = load_records(tier, store, lr_mode) if records is None else records
    claims = [c for c in CLAIMS.values() if tier in tiers_of(c)]
    rates = tuned_rates(tier, store, tier_pairs(claims)) if tier in reg.LR_GRID else {}
    rows = [evaluate_claim(c, tier, records, rates) for c in claims]
    adjusted = cs.holm({r["claim"].id: r["verdict"].p if r["tested"] else 1.0
                        for r in rows if not r["claim"].same_as})
    for row in rows:
        v, c = row["verdict"], row["claim"]
        if row["tested"]:  # a claim equal to another is decided at that one's adjusted p
            p_holm = adjusted[c.same_as or c.id]
            decided = cs.decide(row["differences"], c.direction, c.margin, p_holm)
            if not row["testable"]:
                row["test_alone"], decided = decided, v.verdict
            v = cs.Verdict(decided, v.difference, v.p, p_holm, v.detectable, v.reason, v.flags)
        row["verdict"] = v
        if c.same_as:
            row["identical"] = _identical(c, records, row["seeds"])
    return rows


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


def _ci(iv: cs.Interval | None) -> str:
    if iv is None:
        return "-"
    if iv.n < 2:
        return f"{iv.mean:.2f} (n=1)"
    return f"{iv.mean:.2f} ± {iv.half_width:.2f}"


def _p(p: float) -> str:
    return "-" if not math.isfinite(p) else f"{p:.3g}" if p >= 1e-4 else "<1e-4"


def _collapse_kinds(collapse: dict[str, str]) -> str:
    """Which arms tripped gate (3) and by which part."""
    return ", ".join(f"{arm}: {cs.collapse_parts(why)}" for arm, why in collapse.items())


def _verdict_text(row: dict) -> str:
    v = row["verdict"]
    text = f"**{v.verdict}**"
    if v.reason:
        text += f" ({v.reason})"
    if row.get("test_alone"):
        text += f"; the test alone: {row['test_alone']}"
        if round_sides(row) in ({"+"}, {"-"}):
            text += f", on the same side at each of the last {len(row['by_round'])} evaluations"
    if v.flags and (v.verdict in (cs.REPRODUCED, cs.REFUTED, cs.INCONCLUSIVE)
                    or row.get("test_alone")):
        text += f"; {cs.COLLAPSING} ({_collapse_kinds(row['collapse'])})"
    if row.get("below_target"):
        text += f"; {BELOW_TARGET}"
    if row["claim"].same_as and row.get("identical") is not None:
        text += "; runs identical" if row["identical"] else "; runs differ"
    return text


def plot_setting(tier: str, setting_id: str, records: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from scipy import stats

    arms = [a for a in ARMS if any(k[0] == setting_id and k[1] == a for k in records)]
    if not arms:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for arm in arms:
        rs = [records[k] for k in sorted(records) if k[0] == setting_id and k[1] == arm]
        rounds = [p["round"] for p in rs[0]["curve"]]
        rs = [r for r in rs if [p["round"] for p in r["curve"]] == rounds]
        values = 100 * np.array([[p["accuracy"] for p in r["curve"]] for r in rs])
        mean = values.mean(0)
        line, = ax.plot(rounds, mean, label=f"{arm} (n={len(rs)})")
        if len(rs) > 1:
            half = stats.t.ppf(0.975, len(rs) - 1) * values.std(0, ddof=1) / np.sqrt(len(rs))
            # few seeds give t-bands wider than accuracy can go: drawn within 0-100 only
            ax.fill_between(rounds, np.clip(mean - half, 0, 100), np.clip(mean + half, 0, 100),
                            alpha=0.15, color=line.get_color())
    ax.set_ylim(0, 100)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{setting_id} ({tier} tier): mean over seeds, 95% band", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


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
            "`conf/mini.toml` (depth and rank methods) and `conf/mini-groups.toml` "
            "(HeteroTune's model groups: ViTs of several widths pretrained the same way, on "
            "the same domains). "
            f"{reg.TIER_SEEDS['mini']} paired seeds per claim. Each arm's rate is chosen once per "
            "setting on the validation split carved from the training pool "
            f"(`evaluation-split = \"validation\"`) from {{{_grid('mini')}}} on seeds "
            f"{', '.join(map(str, reg.TUNING_SEEDS))} (no claim uses them): {reg.LR_RULE}. "
            "Calibration on the validation split (seed 100; [calibration-mini.md]"
            "(claims/calibration-mini.md)): AllLarge - AllSmall 41.1 points after 60 rounds "
            "(depth; AllLarge flat on that seed, AllSmall still rising 1.5 points over its last "
            "20% of rounds) and 24.0 after 30 (widths; not flat); the gate judges convergence "
            "again over the claims' seeds. Over ten seeds the rising arms are not flat by the "
            "gate's rule at 60 rounds, and more rounds would not make them so inside the "
            "budget (the record says why), so those claims read **not converged**: their "
            "Holm-adjusted p, what the test alone says and the difference read at each of the "
            "last five evaluations are shown instead of a verdict.",
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
    "minus the other). The statistical plan is fixed in `fedtune_app/tools/claims_registry.py` "
    "before any run: each claim's seed count (no verdict, only **running**, until all are in), "
    "its direction and margin (with the margin's reason), the learning-rate grid and rule. "
    f"**Primary metric**: the mean of a run's last {cs.LAST_EVALUATIONS} evaluations; the final "
    "round and the round chosen on the validation split (tuned tiers) are shown beside it, never "
    "the best round on the test set. **Tests** (scipy), each at "
    f"alpha = {cs.ALPHA:g}: 'greater' a two-sided paired t-test with its 95% interval; 'within "
    "m' (non-inferiority) and 'similar within m' (equivalence, two one-sided tests) one-sided, "
    "with 90% intervals; the **Holm** column adjusts the p-values over every claim the tier "
    f"plans (family-wise error {cs.ALPHA:g}; a claim without all its seeds counts as p = 1, a "
    "claim equal to another once), and a verdict (**reproduced** / **refuted**) needs the "
    "adjusted p below it, else **inconclusive**; a claim whose gate fails gets no verdict, only "
    "what its test alone would say. **Detectable**: the "
    f"smallest difference (for 'within' / 'similar': margin) the claim's seeds establish with "
    f"{cs.POWER:.0%} power at the observed spread, from the exact noncentral t "
    "(`scipy.stats.nct`). **Effect size**: whether the paper's difference lies inside our "
    "interval (consistent), above it (ours smaller) or below it (ours larger); and the "
    "difference over the setting's AllLarge - AllSmall gap beside the paper's same ratio (n/a "
    "where the paper reports no AllSmall); a paper whose difference could not be read here "
    "(only its abstract) shows \"not readable\" and no position. **The gate**, in three "
    "parts: (1) every arm converged: per seed the mean over the last 20% of rounds minus the "
    f"mean over the 20% before, its 95% interval's upper end below {cs.FLAT_POINTS:g} point, "
    "else **not converged**; (2) the setting discriminates: AllLarge - AllSmall (paired 95% "
    "interval, lower end) above the claim's detectable difference, else **setting not "
    "discriminative**; (3) an arm whose final evaluation is below AllSmall's, or more than "
    f"{cs.COLLAPSE_POINTS:g} points under its own best, flags the verdict **{cs.COLLAPSING}**, "
    "naming each such arm and the part it tripped (with model groups, where each group's "
    "model sees only its clients' domains, an arm can sit below AllSmall from the first "
    "evaluation to the last: a weak arm there, not a drift). "
    "On a tier with a fixed seed count, a setting whose mean AllLarge - AllSmall is under the "
    f"{GAP_TARGET:g} points it was calibrated to reach flags its claims' verdicts too (the "
    "tier's design target, beside the gate's part (2), which was fixed per claim before the "
    "runs). "
    f"**Read at single rounds**: each claim's difference is also shown at each of its last "
    f"{READ_AT_ROUNDS} evaluations with the side of the boundary its interval lies on "
    "(unadjusted: a check that the answer does not depend on the round it is read at, not a "
    "test). "
    "**Test-set error**: a seed redraws the training data, not the test set, so the test set's "
    "own sampling error is shown beside the seeds' spread: a bootstrap over test examples where "
    "the records keep which examples each run got right, else the binomial bound "
    "sqrt(sum p (1 - p) / n). " + METRIC_NOTE)


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
        return _ci(cs.t_interval([100 * p[key] for p in last]))

    finals_text = _ci(finals)
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
        window = _ci(gains) + ("" if ok is None else " ok" if ok else " **no**")
    except ValueError:
        window = "too few evaluations"
    under_best = np.mean([final_points(r) - best_points(r) for r in rs])
    lr = rs[0].get("lr")
    return (f"| {arm} | {len(rs)} | {_ci(prim)} | {finals_text} | {selected} | {window} | "
            f"{under_best:+.2f}{' (falls)' if under_best < -cs.COLLAPSE_POINTS else ''} | "
            f"{'-' if lr is None else f'{lr:g}'} | {sum(r['rejected-replies'] for r in rs)} | "
            f"{secs} |")


ARM_HEADER = ["| arm | seeds | primary % (95% CI) | final % (95% CI) | validation-chosen round "
              "(test %) | last-20% gain (95% CI), converged | final - own best | lr | rejected "
              "replies | seconds per run (CPU) |", "|---|---|---|---|---|---|---|---|---|---|"]


def difference_text(row: dict) -> str:
    """The claim's difference with its interval and the interval's level, or '-'."""
    d = row["verdict"].difference
    return "-" if d is None else f"{_ci(d)} ({d.confidence:.0%})" if d.n > 1 else _ci(d)


def beside_text(row: dict) -> str:
    """A claim at the papers' 0.01: its difference (the size, not only the verdict) and verdict."""
    if row["verdict"].difference is None:
        return _verdict_text(row)
    return f"{difference_text(row)}: {_verdict_text(row)}"


def verdict_rows(rows: list[dict], at_paper_rate: dict | None = None) -> list[str]:
    """The verdict table of a tier; ``at_paper_rate``: claim id -> its row at the papers' 0.01,
    shown in a last column (tuned tiers)."""
    head = ("| claim | paper | paper's difference | ours: difference (CI) | paper's against "
            "ours | ours / gap (paper's) | p | Holm p | detectable | seeds | verdict |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|"
    if at_paper_rate is not None:
        head, rule = head + " at lr 0.01: difference (CI), verdict |", rule + "---|"
    lines = [head, rule]
    for row in rows:
        c, v = row["claim"], row["verdict"]
        position, ratio = effect_text(row)
        ci = difference_text(row)
        line = (f"| `{c.id}` | {c.paper} {c.table} | {paper_text(c)} | {ci} | "
                f"{position} | {ratio} | {_p(v.p)} | {_p(v.p_holm)} | "
                f"{'-' if not math.isfinite(v.detectable) else f'{v.detectable:.2f}'} | "
                f"{len(row['seeds'])}/{row['need']} | {_verdict_text(row)} |")
        if at_paper_rate is not None:
            paper_row = at_paper_rate.get(c.id)
            line += f" {'-' if paper_row is None else beside_text(paper_row)} |"
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
            + ", ".join(f"round {r} {_ci(ci)} {side}" for r, ci, side in reads) + f": {same}.")


def paper_rate_text(row: dict) -> str:
    """A claim's line at the papers' 0.01 (every arm at it, the claim's own seeds)."""
    c = row["claim"]
    rerun = f"`fedtune claims run {c.id} --tier {row['tier']} --lr paper`"
    if not row["seeds"]:
        return f"- At the papers' 0.01: no records yet ({rerun})."
    arms = "; ".join(f"{arm} {_ci(info['primary'])}" for arm, info in row["per_arm"].items())
    return (f"- At the papers' 0.01 for every arm ({len(row['seeds'])} of {row['need']} "
            f"seeds; {rerun}): {arms}; difference {beside_text(row)}.")


def claim_section(row: dict, tier: str, choices: dict, at_paper_rate: dict | None = None
                  ) -> list[str]:
    """A claim's section; ``at_paper_rate``: its row at the papers' 0.01 (tuned tiers)."""
    c, v = row["claim"], row["verdict"]
    lines = [f"#### `{c.id}`: {_verdict_text(row)}", "",
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
        text = f"{arm} {_ci(info['primary'])} (final {_ci(info['final'])}"
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
        lines.append(f"- Paired difference: {_ci(d)} points ({d.confidence:.0%} interval), per "
                     "seed " + ", ".join(f"{x:+.2f}" for x in row["differences"])
                     + f"; p {_p(v.p)}, Holm {_p(v.p_holm)}; detectable with "
                     f"{row['need']} seeds: {v.detectable:.2f} points.")
        lines.append(f"- Error of the mean difference: seeds {se_seeds:.2f} points (s / sqrt(n)); "
                     + (f"test set {err:.2f} points ({how})." if math.isfinite(err)
                        else "test set: unknown for these records."))
        position, ratio = effect_text(row)
        lines.append(f"- Effect size: the paper's {paper_text(c)} against ours: "
                     f"{position}; difference / (AllLarge - AllSmall): {ratio}.")
        lines.append(by_round_text(row))
    conv = "; ".join(f"{a} {_ci(g) if isinstance(g, cs.Interval) else g}"
                     + ("" if ok is None else " ok" if ok else " **not converged**")
                     for a, (ok, g) in row["convergence"].items())
    lines.append(f"- Gate (1) convergence, last-20% gain in points (95% CI): {conv}.")
    gaps = "; ".join(
        f"`{st}` AllLarge - AllSmall {_ci(gap)} over seeds {', '.join(map(str, ss))}"
        + ("" if ok is None else " > " if ok else " **not above** ")
        + (f"{v.detectable:.2f}" if ok is not None else "")
        for st, (gap, ok, ss) in row["gaps"].items() if gap is not None) or "not run"
    if row["tier"] in reg.TIER_SEEDS and any(gap for gap, _, _ in row["gaps"].values()):
        gaps += (f"; the tier's design target, a mean of at least {GAP_TARGET:g} points: "
                 + (f"**not met** in {', '.join(f'`{st}`' for st in row['below_target'])}"
                    if row["below_target"] else "met"))
    lines.append(f"- Gate (2) discrimination: {gaps}.")
    flags = "; ".join(v.flags) or "none"
    lines.append(f"- Gate (3) collapse: {flags}.")
    if at_paper_rate is not None:
        lines.append(paper_rate_text(at_paper_rate))
    return lines + [""]


def owner_test_section(store: Path) -> list[str]:
    """The label-skew tier's mechanism, from ``claims_owner``'s record."""
    path = store / "label-skew-owner-test.json"
    if not path.is_file():
        return []
    t = json.loads(path.read_text())
    lines = ["### Why baselines collapse here: the owner test", "",
             f"Under label skew the one client holding all blocks is the only one that trains the "
             f"deepest block, so the full-depth model learns that client's labels. The test: "
             f"`{t['setting']}`, {t['arm']}, seed {t['seed']}, run twice "
             "(`python -m fedtune_app.tools.claims_owner`, in-process, about 2.5 minutes a run "
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
             "package's sources but its tools and the other methods' modules; " + now + "). "
             f"`fedtune claims run --tier {tier} --rerun-older` runs them again (`--dry-run` "
             "first: what it costs). By the commit and fingerprint they record:", "",
             "<details><summary>the "
             "records</summary>", ""]
    for (commit, fp), rs in by_commit.items():
        lines.append(f"- commit `{commit}`, fingerprint `{fp}`: "
                     + ", ".join(f"`{r.get('file', r['hash'])}`" for r in rs))
    return lines + ["", "</details>", ""]


def write_report(tiers=TIERS, out: Path = REPORT, store: Path = STORE,
                 readme: Path | None = README) -> str:
    """docs/claims.md (and the curves' PNGs next to it) from the stored run records; the
    README's verdict table too (``readme=None``: not)."""
    lines = ["# The papers' claims: verdicts", "",
             f"Generated by `fedtune claims report` at commit `{git_commit()}` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}) from the run records in "
             "`docs/claims/runs/` and `docs/claims/tuning/`. Continue a campaign (finished runs "
             "are reused by the hash of their run config) and regenerate:", "", "```bash"]
    lines += [_continue(t) for t in tiers] + ["fedtune claims report", "```", "", HOW_TO_READ,
                                              "", "Update screening is **off** in every claim "
                                              "run (the papers ran none).", ""]
    for tier in tiers:
        lines += tier_section(tier, store, out)
    out.write_text("\n".join(lines) + "\n")
    if readme is not None and readme.is_file():
        update_readme(readme, tiers, store)
    return str(out)


def tier_section(tier: str, store: Path, out: Path) -> list[str]:
    records = load_records(tier, store)
    rows = evaluate(tier, store, records)
    claims = [r["claim"] for r in rows]
    choices = tuned_rates(tier, store, tier_pairs(claims)) if tier in reg.LR_GRID else {}
    at_paper_rate = ({r["claim"].id: r for r in evaluate(tier, store, lr_mode="paper")}
                     if tier in reg.LR_GRID else None)
    lines = [f"## Tier `{tier}`: {TIER_TITLE.get(tier, tier)}", "", TIER_TEXT.get(tier, ""), ""]
    if not records:
        lines += [f"No records yet: every claim reads \"{cs.NOT_RUN}\". Command: "
                  f"`{_continue(tier)}`.", ""]
    lines += (verdict_rows(rows, at_paper_rate) + [""] + tier_summary(rows, records)
              + tier_cost(tier, records, store))
    if choices:
        lines += [f"### Learning rates of tier `{tier}`", "",
                  f"Rule (fixed before any run): {reg.LR_RULE}. Validation means (points) per "
                  "rate; `-`: tuning runs not all in.", "",
                  "| setting | arm | chosen lr | " + " | ".join(
                      f"lr {x:g}" for x in reg.LR_GRID[tier]) + " | best validation round |",
                  "|---|---|---|" + "---|" * len(reg.LR_GRID[tier]) + "---|"]
        for (st, arm), ch in choices.items():
            means = " | ".join(f"{ch.means[x]:.2f} ({ch.seeds[x]})" if x in ch.means else "-"
                               for x in reg.LR_GRID[tier])
            lines.append(f"| `{st}` | {arm} | {'-' if ch.lr is None else f'{ch.lr:g}'} | "
                         f"{means} | {ch.best_round or '-'} |")
        lines.append("")
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
                         + (f"{_ci(gap)} points over seeds {', '.join(map(str, seeds))}."
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
    counts: dict = {}
    for row in rows:
        counts[row["verdict"].verdict] = counts.get(row["verdict"].verdict, 0) + 1
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
    text = ("Campaign: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) + ". ")
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
    return [f"Cost: the {len(spent)} claim runs in took {sum(spent.values()) / 3600:.1f} "
            f"core-hours; the {len(todo)} still to do, about {known / 3600:.1f} more at the "
            "stored seconds of the same arm"
            + (f" ({unknown} runs of arms with no stored run not counted)" if unknown else "")
            + f"; target: all of them in about {TIER_HOURS_TARGET} core-hours. The tuning runs "
            f"so far: {tuning / 3600:.1f} core-hours.", ""]


def verdict_table(tier: str, store: Path = STORE) -> list[str]:
    """The compact verdict table of one tier (the README quotes it)."""
    lines = ["| claim | paper | paper's difference | ours (CI) | paper's against ours | Holm p "
             "| seeds | verdict |", "|---|---|---|---|---|---|---|---|"]
    records = load_records(tier, store)
    rows = evaluate(tier, store, records)
    for row in rows:
        c, v = row["claim"], row["verdict"]
        lines.append(f"| `{c.id}` | {c.paper} {c.table} | {paper_text(c)} | "
                     f"{_ci(v.difference)} | {effect_text(row)[0]} | {_p(v.p_holm)} | "
                     f"{len(row['seeds'])}/{row['need']} | {_verdict_text(row)} |")
    return lines + [""] + tier_summary(rows, records)[:1]


def update_readme(readme: Path, tiers=TIERS, store: Path = STORE) -> None:
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    body = [f"Generated by `fedtune claims report` at commit `{git_commit()}` from "
            "docs/claims.md's records (difference in accuracy points, claimed side minus the "
            "other; primary metric: the mean of the last three evaluations)."]
    for tier in [t for t in ("mini", "cpu") if t in tiers]:
        body += ["", f"Tier `{tier}`: {TIER_TITLE[tier]}.", ""] + verdict_table(tier, store)
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(body) + "\n" + README_END + tail)


# ---------------------------------------------------------------- command line

def list_claims(tier: str | None = None) -> list[dict]:
    return [{"id": c.id, "paper": c.paper, "table": c.table, "sentence": c.sentence,
             "direction": c.direction, "margin": c.margin,
             "seeds": {t: claim_seeds(c, t) for t in tiers_of(c)}, "priority": c.priority,
             "tiers": tiers_of(c), "paper-numbers": c.paper_numbers, "same-as": c.same_as}
            for c in CLAIMS.values() if tier is None or tier in tiers_of(c)]


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
        p.add_argument("--tier", choices=TIERS, default="mini" if p is tune else "cpu")
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
                     help="seeds 0..N-1 for every claim (default: each claim's fixed count on "
                     "the tier: ten on mini, 3 or 5 elsewhere)")
    run.add_argument("--set", default="", metavar="'KEY=VALUE ...'",
                     help="run-config keys for every run, e.g. 'device=\"cuda\"'")
    run.add_argument("--data-dir", action="append", default=[], metavar="DATASET=DIR",
                     help="the paper tier's data: the folder of one data set, set as 'data-dir' "
                     "on its runs only, e.g. nico++=/data/nico (repeat for domainnet)")
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
            return 0
        setup_logging()
        choices = tune_claims(args.ids, args.tier, log=log, arms=arms, jobs=args.jobs,
                              rerun_older=args.rerun_older)
        for (st, arm), ch in choices.items():
            print(f"{st:32s} {arm:18s} lr {'-' if ch.lr is None else f'{ch.lr:g}'}")
    else:
        from fedtune_app.federated.flower_private import parse_config_args

        extra = parse_config_args([args.set]) if args.set else {}
        data_dirs = parse_data_dirs(args.data_dir)
        if args.dry_run:
            print_dry_run(plan_runs(args.ids, args.tier, args.seeds, extra=extra, arms=arms,
                                    lr_mode=args.lr, data_dirs=data_dirs), args.rerun_older)
            return 0
        setup_logging()
        run_claims(args.ids, args.tier, args.seeds, log=log, extra=extra, arms=arms,
                   lr_mode=args.lr, data_dirs=data_dirs, jobs=args.jobs,
                   rerun_older=args.rerun_older)
    if not args.no_report:
        print(write_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
