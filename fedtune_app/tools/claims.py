"""Verdicts on the papers' claims: paired seeds, converged runs, confidence intervals.

    fedtune claims list [--tier cpu]                       the registry (claims_registry.py)
    fedtune claims run [ID|GLOB ...] --tier cpu [--seeds N] run what is missing, resumable
    fedtune claims report                                   docs/claims.md + curves, seconds

``run`` runs every (setting, arm, seed) the named claims need (all claims of the tier, in the
campaign's priority order, when none is named) through the real ServerApp and ClientApp in this
process (``run_inprocess``), seed-major within a priority block, so an interrupted campaign has
whole paired seeds. Each finished run leaves one small JSON file (its curve and final metrics)
in ``docs/claims/runs/<tier>/``, named by the hash of its resolved run config: a run whose
config hash is already there is reused, on this machine or another (commit the files), and a
changed key runs again. ``report`` only reads those files: per setting the convergence gate and
one PNG of the curves (mean over seeds with a 95% band), per claim the paper's numbers, ours
(mean ± 95% Student-t interval per arm), the paired difference with its interval and the
verdict (``claims_stats``).

Notebook use: ``list_claims()``, ``plan_runs(ids, tier, seeds)``, ``run_claims(ids, tier,
seeds)``, ``evaluate(tier)`` (one dict per claim) and ``write_report()``.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedtune_app.config import KEYS, load_preset, parse_int_list
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
    claim_settings,
    tiers_of,
)

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "docs" / "claims"  # runs/<tier>/*.json (committed), <tier>-<setting>.png
REPORT = ROOT / "docs" / "claims.md"
README = ROOT / "README.md"  # its verdict table sits between these two lines
README_BEGIN, README_END = "<!-- claims-table: begin -->", "<!-- claims-table: end -->"
RESULTS = ROOT / "results" / "claims"  # the runs' full results folders (not committed)
TIERS = ("cpu", "gpu", "paper")
MAX_SEEDS = 10  # the report looks for seeds 0..MAX_SEEDS-1
PENDING = "pending (one seed)"  # a gate with a flat reference but no interval yet
DEPTH = {"cpu": 6, "gpu": 12, "paper": 12}  # blocks of the tier's backbones (AllLarge's plan)
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

    @property
    def key(self) -> dict:
        return run_key(self.keys)

    @property
    def hash(self) -> str:
        return config_hash(self.keys)

    @property
    def name(self) -> str:
        return f"{self.setting}__{self.arm}__seed{self.seed}__{self.hash}"


def run_config(tier: str, setting_id: str, arm_label: str, seed: int) -> dict:
    """The run config of one arm of one setting on one seed (a preset is expanded, so every
    given key counts). AllLarge and AllSmall ignore the capacity list but for its length and
    its minimum: they get it canonical, so every setting with the same data shares their runs."""
    import fedtune_app.methods  # noqa: F401 - registers the method-owned keys presets may set

    setting, arm = SETTINGS[setting_id], ARMS[arm_label]
    if tier not in setting.tiers:
        raise ValueError(f"setting {setting_id!r} has no {tier!r} tier (has: "
                         f"{', '.join(setting.tiers)})")
    keys = dict(setting.tiers[tier])
    preset = keys.pop("preset", "")
    keys = (load_preset(preset) if preset else {}) | keys | arm.keys | arm.tier_keys.get(tier, {})
    keys |= {"method": arm.method, "seed": seed}
    plain_list = (keys.get("capacity-profile", "list") == "list"
                  and not keys.get("dynamic-capacities") and not keys.get("model-groups"))
    if plain_list and arm.method in ("all-large", "all-small"):
        caps = parse_int_list("capacities", str(keys.get("capacities", KEYS["capacities"].default)))
        depth = DEPTH[tier] if arm.method == "all-large" else min(caps)
        keys["capacities"] = f"{depth}*{len(caps)}"
    return keys


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


def find_cached(spec: RunSpec, store: Path = STORE) -> dict | None:
    hits = sorted((store / "runs" / spec.tier).glob(f"*__{spec.hash}.json"))
    return json.loads(hits[0].read_text()) if hits else None


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


def plan_runs(patterns: list[str] = (), tier: str = "cpu", seeds: int | None = None,
              store: Path = STORE, extra: dict | None = None,
              arms: list[str] | None = None, data_dirs: dict | None = None) -> list[RunSpec]:
    """Every distinct run the claims need, in campaign order: priority blocks, seed-major within
    a block (seed 0 of every arm, then seed 1, ...), the gate's arms first in each seed.
    ``arms``: only these arm labels (e.g. the gate's arms of every seed first, or one share of
    the campaign per process or machine). ``data_dirs``: dataset -> its ``data-dir``, set on the
    runs of that dataset only (the paper tier reads NICO++ and DomainNet from two folders)."""
    unknown = sorted(set(arms or ()) - set(ARMS))
    if unknown:
        raise SystemExit(f"claims: no arm {', '.join(map(repr, unknown))} (arms: "
                         f"{', '.join(ARMS)})")
    data_dirs = data_dirs or {}
    runs: dict[str, RunSpec] = {}
    claims = match_claims(list(patterns), tier)
    for priority in sorted({c.priority for c in claims}):
        block = [c for c in claims if c.priority == priority]
        pairs = list(dict.fromkeys(p for c in block for p in claim_arms(c)))
        need = {p: max((seeds or c.seeds) for c in block if p in claim_arms(c)) for p in pairs}
        for seed in range(max(need.values())):
            for setting, arm in pairs:
                if seed < need[setting, arm] and (not arms or arm in arms):
                    keys = run_config(tier, setting, arm, seed) | (extra or {})
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


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summarize_run(spec: RunSpec, folder: Path, seconds: float, commit: str) -> dict:
    """The small record of a finished run: its curve, final metrics and rejected replies."""
    metrics = json.loads((folder / "metrics.json").read_text())
    curve = []
    for m in metrics:
        if m["accuracy"] is None:
            continue
        point = {"round": m["round"], "loss": m.get("loss")}
        point |= {k: v for k, v in m.items()
                  if k.startswith("accuracy") and isinstance(v, (int, float))}
        curve.append(point)
    return {"tier": spec.tier, "setting": spec.setting, "arm": spec.arm, "seed": spec.seed,
            "hash": spec.hash, "run-key": spec.key, "curve": curve,
            "final": curve[-1]["accuracy"],
            "rejected-replies": sum(len(m.get("rejected") or ()) for m in metrics),
            "seconds": round(seconds, 1), "rounds": len(metrics),
            "commit": commit, "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                              time.gmtime())}


def execute(spec: RunSpec, results: Path = RESULTS, store: Path = STORE,
            commit: str | None = None) -> dict:
    """Run one (setting, arm, seed) in this process and store its record; ``commit``: the
    code this process loaded (HEAD may move while a campaign runs)."""
    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.apps.results import write_json

    commit = commit or git_commit()
    started = time.time()
    folder = Path(run_inprocess(spec.keys | {"results-dir": str(results / spec.tier)}))
    record = summarize_run(spec, folder, time.time() - started, commit)
    record["results-folder"] = str(folder.relative_to(ROOT) if folder.is_relative_to(ROOT)
                                   else folder)
    out = store / "runs" / spec.tier
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{spec.name}.json", record)
    return record


def run_claims(patterns: list[str] = (), tier: str = "cpu", seeds: int | None = None,
               store: Path = STORE, results: Path = RESULTS, log=print,
               extra: dict | None = None, arms: list[str] | None = None,
               data_dirs: dict | None = None) -> list[dict]:
    """Run whatever the claims still need (finished runs are found by hash and skipped), one
    progress bar with an ETA over every round of the runs left; the records of all runs.
    ``extra``: keys for every run, e.g. {"device": "cuda"}; ``data_dirs``: as ``plan_runs``."""
    from fedtune_app.apps.inprocess import progress

    specs = plan_runs(patterns, tier, seeds, store, extra, arms, data_dirs)
    done = {s.hash: find_cached(s, store) for s in specs}
    todo = [s for s in specs if done[s.hash] is None]
    log(f"claims: {len(specs)} runs, {len(specs) - len(todo)} already done, {len(todo)} to run")
    commit = git_commit()
    with progress([s.keys for s in todo], "claims"):
        for i, spec in enumerate(todo, 1):
            record = execute(spec, results, store, commit)
            done[spec.hash] = record
            log(f"claims: run {i}/{len(todo)} {spec.setting} {spec.arm} seed {spec.seed}: "
                f"accuracy {100 * record['final']:.2f}% in {record['seconds']:.0f} s, "
                f"{record['rejected-replies']} replies rejected")
    return [done[s.hash] for s in specs]


# ---------------------------------------------------------------- evaluation and report

def load_records(tier: str, store: Path = STORE) -> dict[tuple[str, str, int], dict]:
    """(setting, arm, seed) -> record, for every setting whose run config matches a stored run
    (a setting shares the runs of another with the same keys)."""
    by_hash = {}
    for path in sorted((store / "runs" / tier).glob("*.json")):
        record = json.loads(path.read_text())
        by_hash[record["hash"]] = record
    out = {}
    if not by_hash:
        return out
    pairs = {p for c in CLAIMS.values() if tier in tiers_of(c) for p in claim_arms(c)}
    for setting_id, arm in sorted(pairs):
        for seed in range(MAX_SEEDS):
            spec_hash = _hash_or_none(tier, setting_id, arm, seed)
            if spec_hash in by_hash:
                out[setting_id, arm, seed] = by_hash[spec_hash]
    return out


_HASHES: dict = {}


def _hash_or_none(tier, setting_id, arm, seed):
    """The config hash of a (setting, arm, seed), None where the arm does not fit the setting."""
    key = (tier, setting_id, arm, seed)
    if key not in _HASHES:
        try:
            _HASHES[key] = config_hash(run_config(tier, setting_id, arm, seed))
        except Exception:  # an arm that does not fit the setting (e.g. HeteroTune, one model)
            _HASHES[key] = None
    return _HASHES[key]


def _points(record: dict, metric: str = "accuracy") -> float:
    return 100 * record["final"] if metric == "accuracy" else 100 * record["curve"][-1][metric]


def setting_gate(setting_id: str, records: dict) -> dict:
    """The convergence gate of a setting from its reference and AllSmall runs alone."""
    setting = SETTINGS[setting_id]
    seeds = sorted(s for (st, a, s) in records if st == setting_id and a == setting.reference
                   and (setting_id, setting.small, s) in records)
    if not seeds:
        return {"status": cs.NOT_RUN, "seeds": []}
    ref = [records[setting_id, setting.reference, s] for s in seeds]
    curves = [[(p["round"], 100 * p["accuracy"]) for p in r["curve"]] for r in ref]
    small = [_points(records[setting_id, setting.small, s]) for s in seeds]
    g = cs.gate(curves, small)
    status = "passed" if g.passed else cs.TOO_SHORT
    if len(seeds) < 2 and g.gain_last < cs.FLAT_POINTS:  # flat so far, no interval yet
        status = PENDING
    return {"status": status, "gate": g, "seeds": seeds}


def evaluate_claim(claim: Claim, records: dict, gates: dict) -> dict:
    settings = claim_settings(claim)
    seeds = [s for s in range(MAX_SEEDS)
             if all((st, a, s) in records for _, st, a in claim.terms)]
    per_arm = {}
    for _, st, a in claim.terms:
        vals = [_points(records[st, a, s], claim.metric) for s in seeds]
        if vals:
            per_arm[f"{a} ({st})" if len(settings) > 1 else a] = cs.t_interval(vals)
    row = {"claim": claim, "seeds": seeds, "per_arm": per_arm,
           "gates": {st: gates[st] for st in settings}}
    if not seeds:
        row["verdict"] = cs.Verdict(cs.NOT_RUN)
        return row
    diffs = [sum(c * _points(records[st, a, s], claim.metric) for c, st, a in claim.terms)
             for s in seeds]
    v = cs.verdict(diffs, claim.direction, claim.margin)
    gate_status = [gates[st]["status"] for st in settings]
    if cs.TOO_SHORT in gate_status:
        v = cs.Verdict(cs.TOO_SHORT, v.difference, v.detectable, "convergence gate failed")
    elif cs.NOT_RUN in gate_status or PENDING in gate_status:
        v = cs.Verdict(cs.INCONCLUSIVE, v.difference, v.detectable, "gate not decided yet")
    row["verdict"], row["differences"] = v, diffs
    return row


def evaluate(tier: str = "cpu", store: Path = STORE, records: dict | None = None) -> list[dict]:
    """One row per claim of the tier: per-arm intervals, the paired difference, the verdict."""
    records = load_records(tier, store) if records is None else records
    gates = {st: setting_gate(st, records) for st in SETTINGS if tier in SETTINGS[st].tiers}
    return [evaluate_claim(c, records, gates) for c in CLAIMS.values() if tier in tiers_of(c)]


def _ci(iv: cs.Interval | None) -> str:
    if iv is None:
        return "-"
    if iv.n < 2:
        return f"{iv.mean:.2f} (n=1)"
    return f"{iv.mean:.2f} ± {iv.half_width:.2f}"


def _verdict_text(row: dict) -> str:
    v, claim = row["verdict"], row["claim"]
    text = v.verdict
    if v.verdict == cs.INCONCLUSIVE and math.isfinite(v.detectable):
        text += f" (detectable: {v.detectable:.1f} points)"
    if v.reason and v.verdict != cs.INCONCLUSIVE:
        text += f" ({v.reason})"
    elif v.reason and not math.isfinite(v.detectable):
        text += f" ({v.reason})"
    if v.verdict != cs.NOT_RUN and len(row["seeds"]) < claim.seeds:
        text += f"; partial: {len(row['seeds'])} of {claim.seeds} seeds"
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


CONTINUE = {"cpu": "OMP_NUM_THREADS=1 fedtune claims run --tier cpu",
            "gpu": "fedtune claims run --tier gpu",
            "paper": "fedtune claims run --tier paper --data-dir nico++=/data/nico "
                     "--data-dir domainnet=/data/domainnet"}


def _continue(tier: str) -> str:
    return CONTINUE.get(tier, f"fedtune claims run --tier {tier}")


TIER_TEXT = {
    "cpu": "all-MiniLM-L6-v2 (6 blocks x 384, real pretrained weights) on BBC News: "
           f"{CPU_BASE['train-subset']} training articles (stratified subset of the fixed 80/20 "
           "split; 5% of them held out as FedBRICK's server proxy for every method) over 6 "
           "clients with Dirichlet(0.5) label skew, the whole test split (445 articles), "
           f"{CPU_BASE['max-length']} tokens, batch {CPU_BASE['batch-size']}, 1 local epoch, SGD "
           "lr 0.01 (momentum 0.9, weight decay 1e-5, clip 10) for every method: the papers' own "
           "rate, never tuned, with more rounds than the main job's short 0.05 run "
           f"({CPU_BASE['num-server-rounds']} rounds, evaluated every "
           f"{CPU_BASE['eval-every']}). Capacity shapes of each table scaled from 12 to 6 "
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


def arm_row(arm: str, rs: list[dict]) -> str:
    """One arm's row of a setting's table: final accuracy over its seeds, with DepthFL's ensemble
    or, for a method that trains both model groups, each group's own model beside it (their
    mean, the headline, can hide one group that learnt nothing)."""
    finals = cs.t_interval([100 * r["final"] for r in rs])
    best = max(sum(100 * r["curve"][i]["accuracy"] for r in rs) / len(rs)
               for i in range(min(len(r["curve"]) for r in rs)))
    secs = sum(r["seconds"] for r in rs) / len(rs)
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
    fell = finals.mean - best  # a method that falls from its best round diverges
    return (f"| {arm} | {len(rs)} | {finals_text} | {best:.2f} | "
            f"{fell:+.2f}{' (falls)' if fell < -5 else ''} | "
            f"{sum(r['rejected-replies'] for r in rs)} | {secs:.0f} |")


def write_report(tiers=TIERS, out: Path = REPORT, store: Path = STORE,
                 readme: Path | None = README) -> str:
    """docs/claims.md (and the curves' PNGs next to it) from the stored run records; the
    README's verdict table too (``readme=None``: not)."""
    lines = ["# The papers' claims: verdicts", "",
             f"Generated by `fedtune claims report` at commit `{git_commit()}` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}) from the run records in "
             "`docs/claims/runs/`. Continue a campaign (finished runs are reused by the hash of "
             "their run config) and regenerate:", "", "```bash"]
    lines += [_continue(t) for t in tiers] + ["fedtune claims report", "```", ""]
    lines += [
        "How to read it: every method of a claim runs on the same seeds; a seed fixes the "
        "partition, the allocation and capacity draws, the client sampling and the initial "
        "adapters for all of them, so each seed gives one paired difference. Per method: mean "
        "± half-width of the 95% Student-t interval over seeds (`scipy.stats.t`); per claim the "
        "same for the paired difference (claimed side minus the other, accuracy points). "
        "Verdict: **reproduced** when the interval lies on the paper's side (for 'greater' "
        "above 0; for 'within m' above -m; for 'similar within m' inside (-m, m)), "
        "**refuted** when it lies wholly on the other side, else **inconclusive** with the "
        "smallest difference the seeds could have detected (two-sided 5% paired t-test, 80% "
        "power: (t(0.975, n-1) + t(0.8, n-1)) s / sqrt(n)). No verdict without a converged "
        f"setting: AllLarge (the largest model group) must gain < {cs.FLAT_POINTS:g} point over "
        "the last 20% of rounds (mean curve) and beat AllSmall by a paired interval above 0, "
        "else the verdict is **setting too short**. " + METRIC_NOTE,
        "", "Update screening is **off** in every claim run (the papers ran none); the "
        "rejected-replies column confirms that no reply was rejected. No method was tuned: "
        "one learning rate for all, the papers' 0.01.", ""]
    for tier in tiers:
        records = load_records(tier, store)
        rows = evaluate(tier, store, records)
        lines += [f"## Tier `{tier}`", "", TIER_TEXT.get(tier, f"Tier {tier}."), ""]
        if not records:
            lines += [f"Not run here. Command: `{_continue(tier)}`.", ""]
        lines += ["| claim | paper | sentence | paper's difference | ours: difference "
                  "(95% CI) | seeds | verdict |", "|---|---|---|---|---|---|---|"]
        for row in rows:
            c, v = row["claim"], row["verdict"]
            lines.append(f"| `{c.id}` | {c.paper} {c.table} | {c.sentence} | "
                         f"{c.paper_difference:+.2f} | {_ci(v.difference)} | "
                         f"{len(row['seeds'])}/{c.seeds} | {_verdict_text(row)} |")
        lines.append("")
        if not records:
            continue
        lines += [f"### Settings of tier `{tier}`: convergence gates", ""]
        for st in SETTINGS:
            if tier not in SETTINGS[st].tiers:
                continue
            arms = sorted({(a) for (s, a, _) in records if s == st}, key=list(ARMS).index)
            own = [a for a in arms if a not in (SETTINGS[st].reference, SETTINGS[st].small)]
            if not own:  # only the gate's runs, shared with another setting: shown there
                continue
            g = setting_gate(st, records)
            lines += [f"#### `{st}`", "", SETTINGS[st].shape + ".", ""]
            if g["status"] == cs.NOT_RUN:
                lines.append("Gate: AllLarge / AllSmall not run on a common seed yet.")
            else:
                gg = g["gate"]
                why = f" {gg.reason[0].upper()}{gg.reason[1:]}." if gg.reason else ""
                lines.append(
                    f"Gate **{g['status']}** (seeds {', '.join(map(str, g['seeds']))}): AllLarge "
                    f"final {_ci(gg.reference_final)}%, gain over rounds {gg.from_round}-"
                    f"{gg.last_round}: {gg.gain_last:+.2f} points; AllLarge - AllSmall "
                    f"{_ci(gg.over_small)} points.{why}")
            png = store / f"{tier}-{st}.png"
            if plot_setting(tier, st, records, png):
                lines += ["", f"![{st}]({png.relative_to(out.parent).as_posix()})"]
            lines += ["", "| arm | seeds | final accuracy % (95% CI) | best round mean % | "
                      "final - best | rejected replies | seconds per run |",
                      "|---|---|---|---|---|---|---|"]
            for arm in arms:
                rs = [records[k] for k in sorted(records) if k[0] == st and k[1] == arm]
                lines.append(arm_row(arm, rs))
            lines.append("")
        lines += [f"### Claims of tier `{tier}`", ""]
        for row in rows:
            c, v = row["claim"], row["verdict"]
            lines += [f"#### `{c.id}`: {_verdict_text(row)}", "",
                      f"{c.paper}, {c.table}: {c.sentence}. Direction: {c.direction}"
                      + (f", margin {c.margin:g} points" if c.margin else "") + ".", "",
                      f"- Paper: {c.paper_numbers} (difference {c.paper_difference:+.2f}).",
                      f"- Settings: {', '.join(f'`{s}`' for s in claim_settings(c))}; "
                      f"statistic: " + " ".join(f"{w:+g} x {a} ({s})" for w, s, a in c.terms)
                      + ".",
                      f"- Choices: {c.choices}"]
            if row["per_arm"]:
                lines.append("- Ours (final accuracy %, mean ± 95% CI over seeds "
                             f"{', '.join(map(str, row['seeds']))}): "
                             + "; ".join(f"{a} {_ci(iv)}" for a, iv in row["per_arm"].items()))
                lines.append(f"- Paired difference: {_ci(v.difference)} points, per seed "
                             + ", ".join(f"{d:+.2f}" for d in row["differences"]) + ".")
            lines.append("")
    out.write_text("\n".join(lines) + "\n")
    if readme is not None and readme.is_file():
        update_readme(readme, tiers, store)
    return str(out)


def verdict_table(tier: str, store: Path = STORE) -> list[str]:
    """The compact verdict table of one tier (the README quotes it)."""
    lines = ["| claim | paper | paper's difference | ours (95% CI) | seeds | verdict |",
             "|---|---|---|---|---|---|"]
    for row in evaluate(tier, store):
        c, v = row["claim"], row["verdict"]
        lines.append(f"| `{c.id}` | {c.paper} {c.table} | {c.paper_difference:+.2f} | "
                     f"{_ci(v.difference)} | {len(row['seeds'])}/{c.seeds} | "
                     f"{_verdict_text(row)} |")
    return lines


def update_readme(readme: Path, tiers=TIERS, store: Path = STORE) -> None:
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    body = [f"Generated by `fedtune claims report` at commit `{git_commit()}`; tier `cpu` "
            "(difference in accuracy points, claimed side minus the other):", ""]
    body += verdict_table("cpu", store)
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(body) + "\n" + README_END + tail)


# ---------------------------------------------------------------- command line

def list_claims(tier: str | None = None) -> list[dict]:
    return [{"id": c.id, "paper": c.paper, "table": c.table, "sentence": c.sentence,
             "direction": c.direction, "margin": c.margin, "seeds": c.seeds,
             "priority": c.priority, "tiers": tiers_of(c), "paper-numbers": c.paper_numbers}
            for c in CLAIMS.values() if tier is None or tier in tiers_of(c)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fedtune claims", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the claims, their papers' numbers and tiers")
    ls.add_argument("--tier", choices=TIERS)
    run = sub.add_parser("run", help="run what the claims still need (resumable)")
    run.add_argument("ids", nargs="*", help="claim ids or globs (default: every claim of the "
                     "tier, in the campaign's priority order)")
    run.add_argument("--tier", choices=TIERS, default="cpu")
    run.add_argument("--seeds", type=int, default=None,
                     help="seeds 0..N-1 for every claim (default: each claim's own, 3 or 5)")
    run.add_argument("--set", default="", metavar="'KEY=VALUE ...'",
                     help="run-config keys for every run, e.g. 'device=\"cuda\"'")
    run.add_argument("--data-dir", action="append", default=[], metavar="DATASET=DIR",
                     help="the paper tier's data: the folder of one data set, set as 'data-dir' "
                     "on its runs only, e.g. nico++=/data/nico (repeat for domainnet)")
    run.add_argument("--arms", default="", metavar="LABEL,...",
                     help="only these arms, e.g. 'all-large,all-small' (the gate's) to decide "
                     "a setting's gate first, or a disjoint share per process")
    run.add_argument("--dry-run", action="store_true", help="list the runs, run nothing")
    run.add_argument("--no-report", action="store_true", help="do not regenerate the report")
    rep = sub.add_parser("report", help="write docs/claims.md from the stored runs")
    rep.add_argument("--tier", choices=TIERS, action="append",
                     help="tiers to report (default: all)")
    args = parser.parse_args(argv)
    if args.command == "list":
        for c in list_claims(args.tier):
            print(f"{c['id']:38s} {c['paper']:10s} {c['table']:10s} seeds {c['seeds']} "
                  f"tiers {','.join(c['tiers']):14s} {c['sentence']}")
        return 0
    if args.command == "report":
        print(write_report(tuple(args.tier) if args.tier else TIERS))
        return 0
    from fedtune_app.config import setup_logging
    from fedtune_app.federated.flower_private import parse_config_args

    extra = parse_config_args([args.set]) if args.set else {}
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    data_dirs = parse_data_dirs(args.data_dir)
    if args.dry_run:
        for spec in plan_runs(args.ids, args.tier, args.seeds, extra=extra, arms=arms,
                              data_dirs=data_dirs):
            state = "done" if find_cached(spec) else "todo"
            print(f"{state} {spec.name}")
        return 0
    setup_logging()
    run_claims(args.ids, args.tier, args.seeds,
               log=lambda text: print(text, file=sys.stderr, flush=True), extra=extra, arms=arms,
               data_dirs=data_dirs)
    if not args.no_report:
        print(write_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
