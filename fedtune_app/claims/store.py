"""The record store of claim runs: what a run is (``RunSpec``, its run config and the hash
that names its record), where records live, what they cost, and the points read from them."""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.registry import (
    ARMS,
    SETTINGS,
)
from fedtune_app.config import KEYS, load_preset, parse_int_list

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
# the client engine of each tier's runs (key 'client-engine'), part of every run's key: a tier
# switched to the batched engine runs and reads new records, never the sequential ones
CLIENT_ENGINE = {tier: "sequential" for tier in TIERS}
# keys that change where or how often a run writes, not what it computes. Not the client
# engine: the batched one gives each client its sequential update only up to float rounding,
# which sixty rounds grow into another trajectory, so a run of each engine is its own record
# (its hash names the engine; the sequential engine is the default, so the run key of a
# sequential run, every record made before records named their engine, does not name it)
BOOKKEEPING = {"results-dir", "tracker", "checkpoint-every", "resume", "preset",
               "preset-overrides", "device",
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
    engine = CLIENT_ENGINE.get(tier, "sequential")  # a test's own tier: the default
    if engine != "sequential":  # the default: a sequential run's key omits it
        keys["client-engine"] = engine
    if lr is not None:
        keys |= dict.fromkeys(arm.rate_keys, lr)
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
    # from the ratio of the groups, unless the ratio splits the data (group-dirichlet): settings
    # that differ only in it then share its runs
    unused = {"model-group-ratio"} if cfg.fixed_group is not None \
        and cfg.data.partitioner != "group-dirichlet" else set()
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


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def code_commit() -> str:
    """The last commit that changed what the report reads (the package, its presets, the
    records): the report names it, so regenerating from the same tree writes the same file."""
    try:
        return subprocess.run(["git", "log", "-1", "--format=%h", "--", "fedtune_app", "conf",
                               "docs/claims/runs", "docs/claims/tuning",
                               "docs/claims/label-skew-owner-test.json"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record_engine(record: dict) -> str:
    """The client engine that made a record: its own word, else its run key's (a record made
    before records named it: the sequential engine, the only one the campaigns had run)."""
    return record.get("client-engine") or record["run-key"].get("client-engine", "sequential")


def record_method(record: dict) -> str:
    """The method a record ran: its arm's (the run key leaves out a key at its default)."""
    return ARMS[record["arm"]].method


def records_by_hash(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        record["file"] = path.name
        out.setdefault(record["hash"], record)  # the first in name order, as ``find_cached``
    return out


_HASHES: dict = {}


def hash_or_none(tier, setting_id, arm, seed, lr=None, tuning=False, extra=None):
    """The config hash of a (setting, arm, seed) at a rate (``extra``: keys over it, a
    robustness check's), None where the arm does not fit the setting or the config does not
    resolve (e.g. a preset this checkout lacks)."""
    setting = SETTINGS.get(setting_id)  # keyed on what the registry says now (tests change it)
    key = (tier, setting_id, arm, seed, lr, tuning, repr(setting and setting.tiers.get(tier)),
           repr(reg.TUNING_KEYS) if tuning else "", repr(extra))
    if key not in _HASHES:
        try:
            keys = (tuning_config(tier, setting_id, arm, seed, lr) if tuning
                    else run_config(tier, setting_id, arm, seed, lr))
            _HASHES[key] = config_hash(keys | (extra or {}))
        except Exception:  # an arm that does not fit the setting (e.g. HeteroTune, one model)
            _HASHES[key] = None
    return _HASHES[key]


def checkpoints_by_setting(records) -> dict[tuple[str, str], dict[str, list[dict]]]:
    """{(setting, checkpoint file): {digest: the records that loaded it}} of the records that
    name their checkpoints (``execute`` stores them)."""
    found: dict = {}
    for r in records:
        for file, digest in r.get("checkpoints", {}).items():
            found.setdefault((r["setting"], file), {}).setdefault(digest, []).append(r)
    return found


def curve_points(record: dict, metric: str = "accuracy") -> list[tuple[int, float]]:
    return [(p["round"], 100 * p[metric]) for p in record["curve"]]


def primary_points(record: dict, metric: str = "accuracy") -> float:
    """The primary metric of a run in points: the mean of its last three evaluations."""
    return cs.primary([v for _, v in curve_points(record, metric)])


def final_points(record: dict, metric: str = "accuracy") -> float:
    return curve_points(record, metric)[-1][1]


def best_points(record: dict, metric: str = "accuracy") -> float:
    """Its best evaluation (the collapse finding reads it on validation curves only)."""
    return max(v for _, v in curve_points(record, metric))
